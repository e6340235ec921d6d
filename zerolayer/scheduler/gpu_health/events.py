"""GPU events from NVML: what the device reports (Xid errors, ECC errors, P-state changes, the GPU
becoming unavailable, the driver's recovery action) and what each means for serving.

NVML delivers events through an *event set*: ``nvmlEventSetCreate``, then
``nvmlDeviceRegisterEvents(handle, mask, set)`` with the types the device supports
(``nvmlDeviceGetSupportedEventTypes``: ECC events only exist on ECC-enabled boards, the newer types
only with newer drivers), then ``nvmlEventSetWait_v2(set, timeout_ms)``, which blocks (outside the
GIL: ctypes releases it) until an event arrives or raises NVML_ERROR_TIMEOUT. After
NVML_ERROR_UNKNOWN the set is freed and a new one registered (NVML's guidance for a set in an
unknown state). An event's ``eventData`` is documented for Xid events only, so the recovery action
is read with ``nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)`` when its event
arrives. The source is injectable (:class:`EventSource`), so the same monitor runs with a scripted
source in tests and on hosts without a GPU (``zerolayer.scheduler.gpu_health.script``). Source:
NVML API reference, "Event Handling Methods", "Event Types" and "Field Value Queries".
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Protocol

from zerolayer.scheduler.gpu_health.xid import Severity, classify_recovery_action, classify_xid

log = logging.getLogger(__name__)


class EventKind(enum.Enum):
    """Kinds of GPU events (values are metric labels)."""

    XID = "xid"
    SINGLE_BIT_ECC = "single_bit_ecc"
    DOUBLE_BIT_ECC = "double_bit_ecc"
    PSTATE = "pstate"
    GPU_UNAVAILABLE = "gpu_unavailable"
    RECOVERY_ACTION = "recovery_action"
    GPU_LOST = "gpu_lost"
    """Not an NVML event type: waiting on the event set failed with NVML_ERROR_GPU_IS_LOST."""


NVML_EVENT_TYPES: dict[str, EventKind] = {
    "nvmlEventTypeXidCriticalError": EventKind.XID,
    "nvmlEventTypeSingleBitEccError": EventKind.SINGLE_BIT_ECC,
    "nvmlEventTypeDoubleBitEccError": EventKind.DOUBLE_BIT_ECC,
    "nvmlEventTypePState": EventKind.PSTATE,
    "nvmlEventTypeGpuUnavailableError": EventKind.GPU_UNAVAILABLE,
    "nvmlEventTypeGpuRecoveryAction": EventKind.RECOVERY_ACTION,
}
"""The event types the scheduler registers, by pynvml constant name (the last two exist only in
newer nvidia-ml-py releases; a missing constant is skipped)."""

RECOVERY_ACTION_FIELD_ID = 230
"""``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (nvml.h), used where pynvml lacks the constant."""
RECOVERY_ACTION_UNREADABLE = -1
"""The data of a RECOVERY_ACTION event whose value NVML did not give (FATAL: see
:func:`classify_event`)."""
_FIELD_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""``c_nvmlValue_t`` members by ``nvmlValueType_t`` (NVML_VALUE_TYPE_DOUBLE = 0, ...)."""


@dataclass(frozen=True)
class GpuEvent:
    """One event from the device."""

    kind: EventKind
    data: int = 0
    """The event's data: the Xid code (XID), the new P-state (PSTATE), the recovery action value
    (RECOVERY_ACTION; :data:`RECOVERY_ACTION_UNREADABLE` when NVML did not give it); 0
    otherwise."""

    @property
    def xid(self) -> int | None:
        """The Xid code of an XID event, else None."""
        return self.data if self.kind is EventKind.XID else None


@dataclass(frozen=True)
class Verdict:
    """What an event means for serving."""

    severity: Severity
    description: str
    """Names the event, e.g. "Xid 79 (GPU has fallen off the bus)"."""


def classify_event(event: GpuEvent) -> Verdict:
    """The severity and description of ``event`` (Xids per
    :mod:`zerolayer.scheduler.gpu_health.xid`).

    ECC: a double-bit (uncorrectable) error means data on the GPU is wrong, so it is FATAL, like
    Xid 48; a single-bit one was corrected (RECOVERABLE). GPU unavailable and GPU lost are FATAL.
    A recovery action whose value could not be read is FATAL, like one the table does not know.
    """
    kind = event.kind
    if kind is EventKind.XID:
        info = classify_xid(event.data)
        return Verdict(info.severity, f"Xid {info.code} ({info.name})")
    if kind is EventKind.RECOVERY_ACTION and event.data == RECOVERY_ACTION_UNREADABLE:
        return Verdict(Severity.FATAL, "GPU recovery action changed (its value could not be read)")
    if kind is EventKind.RECOVERY_ACTION:
        meaning, severity = classify_recovery_action(event.data)
        return Verdict(severity, f"GPU recovery action {event.data} ({meaning})")
    if kind is EventKind.PSTATE:
        return Verdict(Severity.INFO, f"P-state changed to P{event.data}")
    return {
        EventKind.SINGLE_BIT_ECC: Verdict(Severity.RECOVERABLE, "single-bit ECC error (corrected)"),
        EventKind.DOUBLE_BIT_ECC: Verdict(Severity.FATAL, "double-bit ECC error (uncorrectable)"),
        EventKind.GPU_UNAVAILABLE: Verdict(Severity.FATAL, "GPU unavailable"),
        EventKind.GPU_LOST: Verdict(Severity.FATAL, "GPU is lost (NVML_ERROR_GPU_IS_LOST)"),
    }[kind]


class EventSource(Protocol):
    """Where events come from (NVML, or a script in tests)."""

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        """Blocks up to ``timeout_ms`` for the next event; None when none came."""

    def close(self) -> None:
        """Releases the source."""


def wanted_event_mask(nvml: object) -> int:
    """The OR of the :data:`NVML_EVENT_TYPES` constants this pynvml defines."""
    mask = 0
    for name in NVML_EVENT_TYPES:
        mask |= int(getattr(nvml, name, 0) or 0)
    return mask


def read_recovery_action(nvml: object, handle: object) -> int:
    """The device's current ``nvmlDeviceGpuRecoveryAction_t`` value, read as the field value
    ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``.

    Raises:
        pynvml.NVMLError: the query, or this field, failed (e.g. NVML_ERROR_NOT_SUPPORTED).
    """
    field_id = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION_FIELD_ID)
    (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field_id])  # type: ignore[attr-defined]
    if value.nvmlReturn != getattr(nvml, "NVML_SUCCESS", 0):
        raise nvml.NVMLError(value.nvmlReturn)  # type: ignore[attr-defined]
    return int(getattr(value.value, _FIELD_VALUE_MEMBERS[value.valueType]))


class NvmlEventSource:
    """Events of one device through an NVML event set."""

    def __init__(
        self, nvml: object, handle: object, event_set: object, registered_mask: int
    ) -> None:
        self._nvml = nvml
        self._handle = handle
        self._set: object | None = event_set
        """None after NVML_ERROR_UNKNOWN freed it; the next wait registers a new one."""
        self.registered_mask = registered_mask
        """The event types actually registered (bitmask of nvmlEventType* values)."""
        self._kinds = {
            int(getattr(nvml, name)): kind
            for name, kind in NVML_EVENT_TYPES.items()
            if getattr(nvml, name, None) is not None
        }

    @classmethod
    def open(cls, nvml: object, handle: object) -> NvmlEventSource:
        """Creates an event set and registers every wanted type the device supports.

        Raises:
            pynvml.NVMLError: NVML failed, or no type could be registered.
            RuntimeError: the device supports none of the wanted types.
        """
        n = nvml
        supported = int(n.nvmlDeviceGetSupportedEventTypes(handle))  # type: ignore[attr-defined]
        mask = supported & wanted_event_mask(n)
        if not mask:
            raise RuntimeError(f"the GPU supports none of the event types (mask 0x{supported:x})")
        event_set, registered = _new_set(n, handle, mask)
        log.info(
            "NVML events registered: mask 0x%x (supported 0x%x, wanted 0x%x)",
            registered,
            supported,
            wanted_event_mask(n),
        )
        return cls(n, handle, event_set, registered)

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        """The next event, None on timeout; GPU_LOST when NVML says the GPU is lost.

        After NVML_ERROR_UNKNOWN (raised) the set is freed; the next call registers the same
        types on a new set first.

        Raises:
            pynvml.NVMLError: any other NVML failure, or registering the new set failed.
        """
        n = self._nvml
        if self._set is None:
            self._set, self.registered_mask = _new_set(n, self._handle, self.registered_mask)
            log.info("NVML events registered again: mask 0x%x", self.registered_mask)
        wait = getattr(n, "nvmlEventSetWait_v2", None) or n.nvmlEventSetWait  # type: ignore[attr-defined]
        try:
            data = wait(self._set, timeout_ms)
        except n.NVMLError as exc:  # type: ignore[attr-defined]
            if exc.value == n.NVML_ERROR_TIMEOUT:  # type: ignore[attr-defined]
                return None
            if exc.value == getattr(n, "NVML_ERROR_GPU_IS_LOST", -1):
                return GpuEvent(EventKind.GPU_LOST)
            if exc.value == getattr(n, "NVML_ERROR_UNKNOWN", 999):
                log.warning("NVML event wait failed (%s): freeing the event set", exc)
                self.close()
            raise
        kind = self._kinds.get(int(data.eventType))
        if kind is None:
            log.debug("ignoring NVML event type 0x%x", data.eventType)
            return None
        if kind is EventKind.RECOVERY_ACTION:
            return GpuEvent(kind, self._recovery_action())
        return GpuEvent(kind, int(data.eventData))

    def close(self) -> None:
        """Frees the event set (if it is not already)."""
        event_set, self._set = self._set, None
        if event_set is None:
            return
        try:
            self._nvml.nvmlEventSetFree(event_set)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - shutting down; NVML may already be gone
            log.debug("nvmlEventSetFree failed", exc_info=True)

    def _recovery_action(self) -> int:
        """The recovery action now asked for; RECOVERY_ACTION_UNREADABLE (logged) on failure."""
        try:
            return read_recovery_action(self._nvml, self._handle)
        except Exception as exc:  # noqa: BLE001 - NVMLError or an odd value type
            log.warning("reading the GPU recovery action failed: %s", exc)
            return RECOVERY_ACTION_UNREADABLE


def _new_set(nvml: object, handle: object, mask: int) -> tuple[object, int]:
    """A new event set with the types of ``mask`` registered (see :func:`_register`) and the
    mask registered; the set is freed again when nothing could be registered.

    Raises:
        pynvml.NVMLError: nothing could be registered, or the set could not be created.
    """
    event_set = nvml.nvmlEventSetCreate()  # type: ignore[attr-defined]
    try:
        return event_set, _register(nvml, handle, event_set, mask)
    except Exception:
        nvml.nvmlEventSetFree(event_set)  # type: ignore[attr-defined]
        raise


def _register(nvml: object, handle: object, event_set: object, mask: int) -> int:
    """Registers ``mask`` at once, or else each type alone (a driver may refuse one type that it
    reports as supported, e.g. without the privileges it needs); returns what was registered.

    Raises:
        pynvml.NVMLError: nothing could be registered.
    """
    try:
        nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)  # type: ignore[attr-defined]
        return mask
    except nvml.NVMLError as exc:  # type: ignore[attr-defined]
        log.warning("registering NVML events 0x%x failed (%s); trying each type", mask, exc)
        error = exc
    registered = 0
    for bit in (1 << i for i in range(64)):
        if mask & bit:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, bit, event_set)  # type: ignore[attr-defined]
                registered |= bit
            except nvml.NVMLError as exc:  # type: ignore[attr-defined]
                log.warning("NVML event type 0x%x not registered: %s", bit, exc)
    if not registered:
        raise error
    return registered
