"""Which GPU events mean "stop serving on this GPU": the Xid classification and its sources.

An Xid is the NVIDIA driver's numbered error report (kernel log ``NVRM: Xid (PCI:...): <code>``;
NVML delivers the code as the data of an ``nvmlEventTypeXidCriticalError`` event). The scheduler
sorts each code into one :class:`Severity`:

- ``FATAL``: the GPU itself can no longer be trusted (uncorrectable or uncontained memory errors,
  the device gone from the bus, its firmware processor not answering, memory that could not be
  repaired). The scheduler stops serving on it: health NOT_SERVING, requests in flight and new
  ones fail with UNAVAILABLE. Recovery needs a GPU reset or a reboot, i.e. an operator.
- ``RECOVERABLE``: the hardware reported and handled a fault (corrected errors, a row remapping
  scheduled for the next reset, an error contained to one process); the GPU stays usable. Counted,
  logged, attached to the in-flight requests' spans; serving continues.
- ``APPLICATION``: one process's GPU work was faulty (illegal address, engine exception) and the
  driver ended that work; the GPU is fine. NVML does not say which process: when it was this
  scheduler, its own CUDA call fails and the engine's step error path fails the requests of that
  step. Counted and logged like RECOVERABLE.
- ``INFO``: not an error (e.g. a P-state change).

Sources:

- NVIDIA, "Xid Errors" (docs.nvidia.com/deploy/xid-errors/): the Xid list with possible causes,
  and its Xid catalog for Ampere and newer GPUs, whose "Resolution Bucket (Immediate Action)"
  column (RESTART_APP, RESET_GPU, RESTART_BM, ...) is what the severities below follow: an immediate
  action of RESET_GPU or RESTART_BM is FATAL, RESTART_APP is APPLICATION.
- NVIDIA, "GPU Debug Guidelines" (docs.nvidia.com/deploy/gpu-debug-guidelines/) and "NVIDIA A100
  GPU Memory Error Management" (contained vs uncontained ECC errors, row remapping, dynamic page
  offlining: Xid 63, 64, 94, 95).
- NVML API reference, ``nvmlDeviceGpuRecoveryAction_t``: the driver's own verdict on what a fault
  needs (GPU reset, node reboot, ...), delivered as ``nvmlEventTypeGpuRecoveryAction`` and logged
  as Xid 154; see :data:`RECOVERY_ACTIONS`.

Codes that are not in :data:`XIDS` are UNCLASSIFIED and treated as RECOVERABLE: there are well
over a hundred Xids, many informational, and stopping a server on each would turn noise into
outages. A fault that does need a reset is expected to also raise the driver's recovery action
(FATAL here unless it is NONE or DRAIN_P2P). The table is a policy, not a law: extend it when an
operator learns otherwise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Severity(enum.Enum):
    """What a GPU event means for serving (values are metric labels)."""

    FATAL = "fatal"
    RECOVERABLE = "recoverable"
    APPLICATION = "application"
    INFO = "info"


@dataclass(frozen=True)
class XidInfo:
    """One Xid code's meaning and severity."""

    code: int
    name: str
    """NVIDIA's short description."""
    severity: Severity


def _xid(code: int, name: str, severity: Severity) -> tuple[int, XidInfo]:
    return code, XidInfo(code, name, severity)


XIDS: dict[int, XidInfo] = dict(
    [
        # The GPU cannot be trusted: NVIDIA's immediate action is a GPU reset or a reboot.
        _xid(32, "invalid or corrupted push buffer stream (PCIe/DMA)", Severity.FATAL),
        _xid(48, "double-bit ECC error", Severity.FATAL),
        _xid(62, "internal micro-controller halt", Severity.FATAL),
        _xid(64, "ECC page retirement or row remapping recording failure", Severity.FATAL),
        _xid(74, "NVLink error", Severity.FATAL),
        _xid(79, "GPU has fallen off the bus", Severity.FATAL),
        _xid(95, "uncontained ECC error", Severity.FATAL),
        _xid(119, "GSP RPC timeout", Severity.FATAL),
        _xid(120, "GSP error", Severity.FATAL),
        _xid(140, "unrecovered ECC error", Severity.FATAL),
        _xid(143, "GPU initialization failure", Severity.FATAL),
        # Reported and handled by the hardware; the GPU stays usable until its next reset.
        _xid(63, "ECC page retirement or row remapping recording event", Severity.RECOVERABLE),
        _xid(92, "high single-bit ECC error rate", Severity.RECOVERABLE),
        _xid(
            94, "contained ECC error (the process that touched it is ended)", Severity.RECOVERABLE
        ),
        _xid(121, "C2C link corrected error", Severity.RECOVERABLE),
        _xid(154, "GPU recovery action changed (see the recovery action event)", Severity.INFO),
        # One process's faulty GPU work; NVIDIA's immediate action is to restart that application.
        _xid(8, "GPU stopped processing (channel timeout)", Severity.APPLICATION),
        _xid(13, "graphics engine exception", Severity.APPLICATION),
        _xid(31, "GPU memory page fault", Severity.APPLICATION),
        _xid(43, "GPU stopped processing (channel reset)", Severity.APPLICATION),
        _xid(45, "preemptive cleanup, due to previous errors", Severity.APPLICATION),
    ]
)
"""Classified Xid codes (see the module docstring for sources and the unlisted-code rule)."""


def classify_xid(code: int) -> XidInfo:
    """The meaning of Xid ``code``; unlisted codes are RECOVERABLE and named "unclassified"."""
    return XIDS.get(code) or XidInfo(code, "unclassified", Severity.RECOVERABLE)


RECOVERY_ACTIONS: dict[int, tuple[str, Severity]] = {
    0: ("none", Severity.INFO),
    1: ("GPU reset required", Severity.FATAL),
    2: ("node reboot required", Severity.FATAL),
    # NOTE: DRAIN_P2P asks to quiesce peer-to-peer traffic; the scheduler drives one GPU and no
    # peer-to-peer copies, so serving continues (logged and counted).
    3: ("drain peer-to-peer traffic", Severity.RECOVERABLE),
    4: ("drain and reset (reduced capacity)", Severity.FATAL),
}
"""``nvmlDeviceGpuRecoveryAction_t`` values (NVML_GPU_RECOVERY_ACTION_*): (meaning, severity).
Values not listed (newer NVML versions add actions, and name 5 differently) are FATAL: the driver
asks for an action this table does not know."""


def classify_recovery_action(value: int) -> tuple[str, Severity]:
    """The meaning and severity of a GPU recovery action value."""
    return RECOVERY_ACTIONS.get(value, (f"unknown recovery action {value}", Severity.FATAL))
