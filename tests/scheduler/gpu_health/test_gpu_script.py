"""The scripted GPU (the test-only ``--nvml-script`` source): timed events, tailing, samples."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from zerolayer.scheduler.gpu_health.events import EventKind, GpuEvent
from zerolayer.scheduler.gpu_health.monitor import GpuSample
from zerolayer.scheduler.gpu_health.script import ScriptedGpu


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_events_are_delivered_in_order_when_due(tmp_path: Path) -> None:
    path = tmp_path / "gpu.jsonl"
    path.write_text(
        '{"event": "xid", "data": 13}\n'
        '{"event": "xid", "data": 79, "at_s": 5}\n'
        '{"event": "single_bit_ecc"}\n'
    )
    clock = FakeClock()
    gpu = ScriptedGpu(path, clock)
    assert gpu.wait(0) == GpuEvent(EventKind.XID, 13)
    assert gpu.wait(0) == GpuEvent(EventKind.SINGLE_BIT_ECC, 0)
    assert gpu.wait(0) is None  # Xid 79 is due at 5 s
    clock.now += 5
    assert gpu.wait(0) == GpuEvent(EventKind.XID, 79)
    assert gpu.wait(0) is None


def test_the_file_is_tailed_and_partial_lines_wait(tmp_path: Path) -> None:
    path = tmp_path / "gpu.jsonl"
    gpu = ScriptedGpu(path)  # the file does not exist yet
    assert gpu.wait(0) is None
    append(path, '{"event": "gpu_unavail')
    assert gpu.wait(0) is None
    append(path, 'able"}\n{"event": "recovery_action", "data": 2}\n')
    assert gpu.wait(0) == GpuEvent(EventKind.GPU_UNAVAILABLE, 0)
    assert gpu.wait(0) == GpuEvent(EventKind.RECOVERY_ACTION, 2)


def test_wait_blocks_until_an_event_is_appended(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "gpu.jsonl"
    path.write_text("")
    gpu = ScriptedGpu(path)
    timer = threading.Timer(0.05, append, (path, '{"event": "xid", "data": 48}\n'))
    timer.start()
    assert gpu.wait(5000) == GpuEvent(EventKind.XID, 48)
    timer.join()


def test_samples_repeat_the_latest_line(tmp_path: Path) -> None:
    path = tmp_path / "gpu.jsonl"
    gpu = ScriptedGpu(path)
    assert gpu.sample() == GpuSample(0.0, 0, 0)
    append(
        path,
        '{"sample": {"sm_utilization_percent": 90, "memory_used_bytes": 4096, '
        '"clock_event_reasons": 64}}\n',
    )
    assert gpu.sample() == GpuSample(90.0, 4096, 64)
    assert gpu.sample() == GpuSample(90.0, 4096, 64)


def test_bad_lines_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "gpu.jsonl"
    path.write_text('not json\n{"event": "meltdown"}\n[1]\n{"event": "xid", "data": 31}\n')
    gpu = ScriptedGpu(path)
    with caplog.at_level(logging.ERROR):
        assert gpu.wait(0) == GpuEvent(EventKind.XID, 31)
    assert sum("skipping a line" in r.getMessage() for r in caplog.records) == 3
