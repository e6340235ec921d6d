"""Sampled GPU signals for the scheduler: SM utilisation (and its stability), memory used, and
clock-event (throttle) reasons, polled from NVML every ~100 ms.

NVML (nvidia-ml-py, the ``pynvml`` module) has no "SM idle" event: utilisation and throttle
reasons can only be *sampled*. The source is injectable, so the same poller runs in tests with a
scripted source and on hosts without a GPU it is simply absent.

SM-utilisation stability index over a sliding window of samples: ``1 - std / mean`` (1 = perfectly
steady, lower = bursty; undefined while the mean is 0).
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""NVML clock event reason bits (nvmlClocksEventReason*, NVML API reference) and metric labels."""


@dataclass(frozen=True)
class GpuSample:
    """One poll of the device."""

    sm_utilization_percent: float
    """Percent of the sample period in which a kernel ran (nvmlDeviceGetUtilizationRates.gpu)."""
    memory_used_bytes: int
    clock_event_reasons: int
    """Bitmask of nvmlClocksEventReason* values."""


class SampleSource(Protocol):
    """Where samples come from (NVML, or a script in tests)."""

    def sample(self) -> GpuSample:
        """Reads the device now."""


class StabilityWindow:
    """The last ``size`` SM-utilisation samples and their stability index."""

    def __init__(self, size: int = 50) -> None:
        self._samples: deque[float] = deque(maxlen=size)

    def add(self, value: float) -> None:
        """Appends a sample (percent)."""
        self._samples.append(value)

    def index(self) -> float | None:
        """``1 - std/mean`` (population std) over the window; None with < 2 samples or mean 0."""
        if len(self._samples) < 2:
            return None
        mean = statistics.fmean(self._samples)
        if mean == 0:
            return None
        return 1.0 - statistics.pstdev(self._samples) / mean


def open_nvml(device_index: int, uuid: str | None = None) -> tuple[object, object] | None:
    """Initialises NVML and returns ``(pynvml, handle)`` of one device; None when nvidia-ml-py or
    a driver is missing.

    Args:
        device_index: the CUDA device index, used when ``uuid`` is None or unknown to NVML.
        uuid: the device's UUID as NVML spells it (``GPU-...``). NVML numbers devices ignoring
            ``CUDA_VISIBLE_DEVICES``, so the UUID is what finds the device CUDA calls ``index``.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - ImportError or any NVMLError: no GPU here
        log.info("NVML unavailable (%s): no GPU sampling or events", exc)
        return None
    try:
        if uuid is not None:
            try:
                return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except pynvml.NVMLError as exc:
                log.warning(
                    "NVML does not know GPU %s (%s); using index %d", uuid, exc, device_index
                )
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except Exception as exc:  # noqa: BLE001 - any NVMLError
        log.warning("NVML has no device %d (%s): no GPU sampling or events", device_index, exc)
        return None


class NvmlSource:
    """Samples one device through NVML."""

    def __init__(self, nvml: object, handle: object) -> None:
        self._nvml = nvml
        self._handle = handle

    @classmethod
    def open(cls, device_index: int, uuid: str | None = None) -> NvmlSource | None:
        """Opens NVML for one device (see :func:`open_nvml`); None without nvidia-ml-py or a
        driver."""
        opened = open_nvml(device_index, uuid)
        return None if opened is None else cls(*opened)

    def sample(self) -> GpuSample:
        nvml, handle = self._nvml, self._handle
        reasons_fn = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return GpuSample(
            sm_utilization_percent=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            memory_used_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).used),
            clock_event_reasons=int(reasons_fn(handle)),
        )


class GpuPoller:
    """Polls a source every ``interval_s`` on its own thread and updates the metrics."""

    def __init__(
        self,
        source: SampleSource,
        registry: CollectorRegistry,
        interval_s: float = 0.1,
        window: int = 50,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.source = source
        self.interval_s = interval_s
        self.window = StabilityWindow(window)
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._thread = threading.Thread(target=self._run, name="gpu-poller", daemon=True)
        self.stability = Gauge(
            "zerolayer_gpu_sm_utilization_stability",
            "1 - std/mean of SM utilisation over the sample window",
            registry=registry,
        )
        self.utilization = Gauge(
            "zerolayer_gpu_sm_utilization_percent", "Last sampled SM utilisation", registry=registry
        )
        self.memory_used = Gauge(
            "zerolayer_gpu_memory_used_bytes", "Device memory used", registry=registry
        )
        self.throttled = Counter(
            "zerolayer_gpu_throttled_seconds",
            "Seconds during which a clock event (throttle) reason was active",
            ["reason"],
            registry=registry,
        )

    def start(self) -> None:
        """Starts polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stops polling."""
        self._stop.set()
        self._thread.join(timeout=5)

    def poll_once(self) -> GpuSample:
        """Takes one sample and updates the metrics (the thread calls this every interval)."""
        sample = self.source.sample()
        self.window.add(sample.sm_utilization_percent)
        self.utilization.set(sample.sm_utilization_percent)
        self.memory_used.set(sample.memory_used_bytes)
        index = self.window.index()
        if index is not None:
            self.stability.set(index)
        for bit, reason in THROTTLE_REASONS.items():
            if sample.clock_event_reasons & bit:
                self.throttled.labels(reason).inc(self.interval_s)
        return sample

    def _run(self) -> None:
        failing = False
        while not self._sleep(self.interval_s):
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - a failed sample must not kill the poller
                # NOTE: logged once per run of failures, not every 100 ms (a lost GPU fails
                # every sample; the event thread reports the loss itself).
                if not failing:
                    log.exception("GPU sample failed (logged again only after a success)")
                failing = True
            else:
                failing = False
