"""GPU sampling with a scripted source: stability index, throttle seconds, memory."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from zerolayer.scheduler.gpu_health.monitor import GpuPoller, GpuSample, NvmlSource, StabilityWindow


class ScriptedSource:
    def __init__(self, samples: list[GpuSample]) -> None:
        self._samples = iter(samples)

    def sample(self) -> GpuSample:
        return next(self._samples)


def value(registry: CollectorRegistry, name: str, labels: dict | None = None) -> float | None:
    return registry.get_sample_value(name, labels or {})


def test_stability_index_is_one_minus_cv() -> None:
    window = StabilityWindow(size=4)
    assert window.index() is None
    for v in (50, 50):
        window.add(v)
    assert window.index() == 1.0
    window.add(100)
    window.add(0)  # window: 50, 50, 100, 0 -> mean 50, pstdev 35.355...
    assert window.index() == pytest.approx(1 - 35.35533905932738 / 50)
    window.add(0)
    window.add(0)
    window.add(0)
    window.add(0)
    assert window.index() is None  # mean 0: undefined


def test_poller_moves_the_metrics() -> None:
    registry = CollectorRegistry()
    samples = [GpuSample(80, 1000, 0x0), GpuSample(40, 2000, 0x4 | 0x40), GpuSample(60, 3000, 0x40)]
    poller = GpuPoller(ScriptedSource(samples), registry, interval_s=0.1)
    poller.poll_once()
    assert value(registry, "zerolayer_gpu_sm_utilization_stability") == 0.0  # not set yet
    poller.poll_once()
    poller.poll_once()
    mean, std = 60.0, (800 / 3) ** 0.5
    assert value(registry, "zerolayer_gpu_sm_utilization_stability") == pytest.approx(
        1 - std / mean
    )
    assert value(registry, "zerolayer_gpu_memory_used_bytes") == 3000
    assert value(
        registry, "zerolayer_gpu_throttled_seconds_total", {"reason": "hw_thermal_slowdown"}
    ) == pytest.approx(0.2)
    assert value(
        registry, "zerolayer_gpu_throttled_seconds_total", {"reason": "sw_power_cap"}
    ) == pytest.approx(0.1)
    assert value(registry, "zerolayer_gpu_throttled_seconds_total", {"reason": "gpu_idle"}) is None


def test_nvml_is_absent_without_a_gpu() -> None:
    # Dev and CI machines have no GPU (and usually no nvidia-ml-py): no source, no crash.
    assert NvmlSource.open(0) is None
