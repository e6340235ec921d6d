"""The NVML event source against a fake pynvml: registration of the supported mask, waiting,
timeouts, a lost GPU, a new event set after NVML_ERROR_UNKNOWN, the recovery action read from its
field value, and pynvml versions without the newer event types; and the on-GPU self-check
(zerolayer.scheduler.gpu_health.nvml_check) against the same fake."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from zerolayer.scheduler.gpu_health.events import (
    RECOVERY_ACTION_UNREADABLE,
    EventKind,
    GpuEvent,
    NvmlEventSource,
    classify_event,
    wanted_event_mask,
)
from zerolayer.scheduler.gpu_health.nvml_check import nvml_self_check
from zerolayer.scheduler.gpu_health.xid import Severity

HANDLE = object()
EVENT_SET = object()


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The pynvml calls the source makes; constants as nvidia-ml-py defines them."""

    NVMLError = NVMLError
    NVML_SUCCESS = 0
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_UNKNOWN = 999
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
    nvmlEventTypeSingleBitEccError = 0x1
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypePState = 0x4
    nvmlEventTypeXidCriticalError = 0x8
    nvmlEventTypeClock = 0x10
    nvmlEventTypeGpuUnavailableError = 0x4000
    nvmlEventTypeGpuRecoveryAction = 0x8000

    def __init__(self, supported: int, refuse: int = 0) -> None:
        self.supported = supported
        self.refuse = refuse
        """Event bits whose registration fails with NOT_SUPPORTED."""
        self.registered: list[int] = []
        self.created = 0
        self.freed: list[object] = []
        self.recovery_action: tuple[int, int, str, int] = (0, 1, "uiVal", 2)
        """The recovery action field as (nvmlReturn, valueType, union member, value)."""
        self.waits: deque[object] = deque()
        """What each wait returns (event data) or raises (an NVMLError value)."""

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:  # noqa: N802
        assert handle is HANDLE
        return self.supported

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        self.created += 1
        return EVENT_SET

    def nvmlDeviceRegisterEvents(self, handle: object, mask: int, event_set: object) -> None:  # noqa: N802
        assert (handle, event_set) == (HANDLE, EVENT_SET)
        if mask & self.refuse:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append(mask)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> object:  # noqa: N802
        assert event_set is EVENT_SET
        item = self.waits.popleft() if self.waits else self.NVML_ERROR_TIMEOUT
        if isinstance(item, int):
            raise NVMLError(item)
        return item

    def nvmlEventSetFree(self, event_set: object) -> None:  # noqa: N802
        self.freed.append(event_set)

    def nvmlDeviceGetFieldValues(self, handle: object, field_ids: list) -> list:  # noqa: N802
        assert (handle, field_ids) == (HANDLE, [230])
        status, value_type, member, value = self.recovery_action
        return [
            SimpleNamespace(
                fieldId=230,
                nvmlReturn=status,
                valueType=value_type,
                value=SimpleNamespace(**{member: value}),
            )
        ]

    # Sampling (the poller's NvmlSource) and device lookup, for the self-check.
    memory_used = 2 << 30
    utilization = 37
    clock_event_reasons = 0x1

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(total=80 << 30, used=self.memory_used, free=0)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self.utilization, memory=0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:  # noqa: N802
        return self.clock_event_reasons

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object:  # noqa: N802
        if uuid != "GPU-1234":
            raise NVMLError(13)
        return HANDLE


class OldNvml(FakeNvml):
    """An nvidia-ml-py from before the GPU-unavailable and recovery-action event types."""

    nvmlEventTypeGpuUnavailableError = None
    nvmlEventTypeGpuRecoveryAction = None


def event_data(event_type: int, data: int = 0) -> SimpleNamespace:
    return SimpleNamespace(eventType=event_type, eventData=data, gpuInstanceId=0)


def test_registers_the_supported_wanted_types_at_once() -> None:
    nvml = FakeNvml(supported=0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x8000)
    source = NvmlEventSource.open(nvml, HANDLE)
    # Clock events (0x10) are supported but not wanted; 0x4000 is wanted but not supported.
    assert nvml.registered == [0x800F]
    assert source.registered_mask == 0x800F


def test_older_pynvml_without_the_new_types() -> None:
    nvml = OldNvml(supported=0xFFFF)
    assert wanted_event_mask(nvml) == 0xF
    source = NvmlEventSource.open(nvml, HANDLE)
    assert source.registered_mask == 0xF


def test_falls_back_to_one_type_at_a_time() -> None:
    nvml = FakeNvml(supported=0x1 | 0x2 | 0x8, refuse=0x1)
    source = NvmlEventSource.open(nvml, HANDLE)
    assert nvml.registered == [0x2, 0x8]
    assert source.registered_mask == 0xA


def test_nothing_registrable_frees_the_set_and_raises() -> None:
    nvml = FakeNvml(supported=0x1, refuse=0x1)
    with pytest.raises(NVMLError):
        NvmlEventSource.open(nvml, HANDLE)
    assert nvml.freed == [EVENT_SET]


def test_no_supported_type_raises() -> None:
    nvml = FakeNvml(supported=0x10)
    with pytest.raises(RuntimeError, match="supports none"):
        NvmlEventSource.open(nvml, HANDLE)


def test_wait_returns_events_and_none_on_timeout() -> None:
    nvml = FakeNvml(supported=0xC00F)
    source = NvmlEventSource.open(nvml, HANDLE)
    nvml.waits.extend(
        [
            event_data(0x8, 79),
            nvml.NVML_ERROR_TIMEOUT,
            event_data(0x2),
            event_data(0x4, 8),
            event_data(0x8000, 1),  # eventData is not the action: the field value (2) is
            event_data(0x10),  # a type the source did not ask for
            nvml.NVML_ERROR_GPU_IS_LOST,
        ]
    )
    got = [source.wait(100) for _ in range(7)]
    assert got == [
        GpuEvent(EventKind.XID, 79),
        None,
        GpuEvent(EventKind.DOUBLE_BIT_ECC, 0),
        GpuEvent(EventKind.PSTATE, 8),
        GpuEvent(EventKind.RECOVERY_ACTION, 2),
        None,
        GpuEvent(EventKind.GPU_LOST, 0),
    ]
    source.close()
    assert nvml.freed == [EVENT_SET]


def test_other_nvml_errors_propagate() -> None:
    nvml = FakeNvml(supported=0x8)
    source = NvmlEventSource.open(nvml, HANDLE)
    nvml.waits.append(2)  # NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(NVMLError):
        source.wait(100)
    assert (nvml.created, nvml.freed) == (1, [])  # the set stays


def test_an_unknown_error_frees_the_set_and_the_next_wait_registers_a_new_one() -> None:
    nvml = FakeNvml(supported=0x800F, refuse=0x1)
    source = NvmlEventSource.open(nvml, HANDLE)
    assert nvml.registered == [0x2, 0x4, 0x8, 0x8000]
    nvml.waits.extend([nvml.NVML_ERROR_UNKNOWN, event_data(0x8, 48)])
    with pytest.raises(NVMLError, match="NVML error 999"):
        source.wait(100)
    assert (nvml.created, nvml.freed) == (1, [EVENT_SET])
    assert source.wait(100) == GpuEvent(EventKind.XID, 48)
    assert nvml.created == 2
    assert nvml.registered[4:] == [0x800E]  # the types registered before, at once
    assert source.registered_mask == 0x800E
    source.close()
    source.close()
    assert nvml.freed == [EVENT_SET, EVENT_SET]


def test_a_failed_new_registration_frees_that_set_and_is_tried_again() -> None:
    nvml = FakeNvml(supported=0x8)
    source = NvmlEventSource.open(nvml, HANDLE)
    nvml.waits.append(nvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(NVMLError):
        source.wait(100)
    nvml.refuse = 0x8
    with pytest.raises(NVMLError, match="NVML error 3"):
        source.wait(100)
    assert (nvml.created, nvml.freed) == (2, [EVENT_SET, EVENT_SET])
    nvml.refuse = 0
    assert source.wait(100) is None
    assert (nvml.created, nvml.registered) == (3, [0x8, 0x8])


@pytest.mark.parametrize(
    ("field", "event", "severity"),
    [
        ((0, 1, "uiVal", 0), GpuEvent(EventKind.RECOVERY_ACTION, 0), Severity.INFO),
        ((0, 1, "uiVal", 1), GpuEvent(EventKind.RECOVERY_ACTION, 1), Severity.FATAL),
        ((0, 3, "ullVal", 3), GpuEvent(EventKind.RECOVERY_ACTION, 3), Severity.RECOVERABLE),
        (
            (3, 1, "uiVal", 0),  # this field NOT_SUPPORTED
            GpuEvent(EventKind.RECOVERY_ACTION, RECOVERY_ACTION_UNREADABLE),
            Severity.FATAL,
        ),
    ],
)
def test_the_recovery_action_comes_from_its_field_value(
    field: tuple[int, int, str, int], event: GpuEvent, severity: Severity
) -> None:
    nvml = FakeNvml(supported=0x8000)
    nvml.recovery_action = field
    source = NvmlEventSource.open(nvml, HANDLE)
    nvml.waits.append(event_data(0x8000, 4))  # eventData would say "drain and reset": ignored
    got = source.wait(100)
    assert got == event
    assert classify_event(got).severity is severity


def test_an_unreadable_recovery_action_is_described_as_such() -> None:
    verdict = classify_event(GpuEvent(EventKind.RECOVERY_ACTION, RECOVERY_ACTION_UNREADABLE))
    assert (verdict.severity, verdict.description) == (
        Severity.FATAL,
        "GPU recovery action changed (its value could not be read)",
    )


def test_self_check_passes_on_a_sane_device() -> None:
    nvml = FakeNvml(supported=0xC00F)
    nvml.waits.append(event_data(0x4, 0))
    report = nvml_self_check(num_samples=2, uuid="GPU-1234", opened=(nvml, HANDLE))
    assert report["problems"] == [] and report["ok"] is True
    assert (report["supported_mask"], report["wanted_mask"], report["registered_mask"]) == (
        0xC00F,
        0xC00F,
        0xC00F,
    )
    assert report["event_types"] == [
        "nvmlEventTypeXidCriticalError",
        "nvmlEventTypeSingleBitEccError",
        "nvmlEventTypeDoubleBitEccError",
        "nvmlEventTypePState",
        "nvmlEventTypeGpuUnavailableError",
        "nvmlEventTypeGpuRecoveryAction",
    ]
    assert report["wait"] == "pstate 0"
    assert (report["recovery_action"], report["notes"]) == (2, [])
    assert (
        report["samples"]
        == [
            {"sm_utilization_percent": 37.0, "memory_used_bytes": 2 << 30, "clock_event_reasons": 1}
        ]
        * 2
    )
    assert nvml.freed == [EVENT_SET]


def test_self_check_reports_insane_values() -> None:
    nvml = FakeNvml(supported=0x8, refuse=0x8)
    nvml.utilization, nvml.memory_used, nvml.clock_event_reasons = 140, 0, 0x10000
    report = nvml_self_check(num_samples=1, uuid="GPU-5678", opened=(nvml, HANDLE))
    assert report["ok"] is False
    assert report["problems"] == [
        "NVML does not know torch's UUID GPU-5678: NVML error 13",
        "event registration failed: NVMLError: NVML error 3",
        "SM utilisation 140.0 not in 0..100",
        f"memory used 0 not in (0, {80 << 30}]",
    ]
    assert report["notes"] == ["unknown clock event bits 0x10000"]


def test_self_check_notes_event_types_the_driver_refuses() -> None:
    nvml = FakeNvml(supported=0xC00F, refuse=0x1 | 0x4000)
    report = nvml_self_check(num_samples=1, uuid="GPU-1234", opened=(nvml, HANDLE))
    assert (report["ok"], report["problems"]) == (True, [])
    assert report["registered_mask"] == 0x800E
    assert report["notes"] == [
        "the driver refused nvmlEventTypeSingleBitEccError, nvmlEventTypeGpuUnavailableError "
        "(0x4001); the scheduler runs without them"
    ]


@pytest.mark.parametrize(
    ("supported", "where"), [(0x800F, "problems"), (0x000F, "notes")], ids=["registered", "not"]
)
def test_self_check_reads_the_recovery_action_field(supported: int, where: str) -> None:
    nvml = FakeNvml(supported=supported)
    nvml.recovery_action = (3, 1, "uiVal", 0)
    report = nvml_self_check(num_samples=1, uuid="GPU-1234", opened=(nvml, HANDLE))
    assert report["recovery_action"] == "NVMLError: NVML error 3"
    assert report[where] == ["reading the recovery action field failed: NVMLError: NVML error 3"]
    assert report["ok"] is (where == "notes")


@pytest.mark.gpu
def test_nvml_events_and_sampling_on_the_real_gpu() -> None:
    """On a GPU: the supported event types register, polling reads sane values, torch's UUID
    finds the device, and the event thread stops within its wait timeout (a healthy GPU raises
    no fatal event meanwhile)."""
    import time

    from prometheus_client import CollectorRegistry

    from zerolayer.scheduler.gpu_health.monitor import open_nvml
    from zerolayer.scheduler.gpu_health.watch import GpuEventMonitor, cuda_uuid

    uuid = cuda_uuid(0)
    report = nvml_self_check(0, num_samples=3, uuid=uuid)
    assert report["ok"], report
    opened = open_nvml(0, uuid)
    assert opened is not None
    faults: list = []
    monitor = GpuEventMonitor(NvmlEventSource.open(*opened), CollectorRegistry(), faults.append)
    monitor.start()
    time.sleep(0.3)
    stopping = time.monotonic()
    monitor.stop()
    assert time.monotonic() - stopping < 1.0
    assert faults == []
