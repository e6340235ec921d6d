"""The NVML event source against a fake pynvml: registration of the supported mask, waiting,
timeouts, a lost GPU, and pynvml versions without the newer event types; and the on-GPU
self-check (zerolayer.scheduler.gpu_health.nvml_check) against the same fake."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from zerolayer.scheduler.gpu_health.events import (
    EventKind,
    GpuEvent,
    NvmlEventSource,
    wanted_event_mask,
)
from zerolayer.scheduler.gpu_health.nvml_check import nvml_self_check

HANDLE = object()
EVENT_SET = object()


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The pynvml calls the source makes; constants as nvidia-ml-py defines them."""

    NVMLError = NVMLError
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_NOT_SUPPORTED = 3
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
        self.freed: list[object] = []
        self.waits: deque[object] = deque()
        """What each wait returns (event data) or raises (an NVMLError value)."""

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:  # noqa: N802
        assert handle is HANDLE
        return self.supported

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
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
            event_data(0x8000, 1),
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
        GpuEvent(EventKind.RECOVERY_ACTION, 1),
        None,
        GpuEvent(EventKind.GPU_LOST, 0),
    ]
    source.close()
    assert nvml.freed == [EVENT_SET]


def test_other_nvml_errors_propagate() -> None:
    nvml = FakeNvml(supported=0x8)
    source = NvmlEventSource.open(nvml, HANDLE)
    nvml.waits.append(999)
    with pytest.raises(NVMLError):
        source.wait(100)


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
