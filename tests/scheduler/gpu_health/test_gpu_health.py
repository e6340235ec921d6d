"""The GPU event thread and the engine: a fatal Xid during 8 concurrent requests ends them with
UNAVAILABLE within one step, frees their blocks and refuses new requests; recoverable events
change nothing but the metric (and the spans); scripted samples move the poller's metrics.

The engine runs its real thread, scheduler, KV cache manager (over an in-process block pool) and
sampler; the model runner is a stand-in that returns a fixed one-hot logit row per request, so
the test is about control flow, not numerics.
"""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from factories import make_engine_request, make_engine_without_model
from prometheus_client import CollectorRegistry

from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import EngineRequest, FinishReason, RequestOutput
from zerolayer.kvstore.in_process import LocalBlockAllocator
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.core.scheduler_output import SchedulerOutput
from zerolayer.scheduler.gpu_health.events import EventKind, GpuEvent, classify_event
from zerolayer.scheduler.gpu_health.monitor import GpuPoller
from zerolayer.scheduler.gpu_health.script import ScriptedGpu
from zerolayer.scheduler.gpu_health.watch import (
    GpuEventMonitor,
    GpuFault,
    span_attributes,
    watch_gpu,
)

VOCAB = 64
BLOCK_SIZE = 4
NUM_BLOCKS = 256
NUM_REQUESTS = 8
STEP_S = 0.005


class StubRunner:
    """Logits whose argmax is ``3 + num_tokens % 50`` for each sampling request; ~5 ms a step."""

    block_size = BLOCK_SIZE
    attention_backend = "reference"
    num_cuda_graphs = 0

    def execute(self, output: SchedulerOutput) -> torch.Tensor:
        time.sleep(STEP_S)
        rows = [s.request for s in output.scheduled if s.samples]
        logits = torch.zeros(len(rows), VOCAB)
        for i, request in enumerate(rows):
            logits[i, 3 + request.num_tokens % 50] = 1.0
        return logits


class FakeTrace:
    """A RequestTrace that records only span events (the engine's ``annotate``)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def add_event(self, name: str, attributes: dict) -> None:
        self.events.append((name, attributes))

    def context_load(self) -> nullcontext:
        return nullcontext(None)

    def attached(self) -> nullcontext:
        return nullcontext()

    def set_context(self, *args: object) -> None:
        pass

    def admitted(self) -> None:
        pass

    def first_token(self) -> None:
        pass

    def finished(self, *args: object) -> None:
        pass


class Collector:
    """A request's sink: tokens, finish reasons, the error, and the step it arrived at."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.token_ids: list[int] = []
        self.finish_reasons: list[FinishReason] = []
        self.error: Exception | None = None
        self.error_step: int | None = None
        self.done = threading.Event()

    def __call__(self, item: RequestOutput | Exception) -> None:
        if isinstance(item, Exception):
            self.error, self.error_step = item, self.engine.num_steps
            self.done.set()
            return
        self.token_ids.extend(item.new_token_ids)
        self.finish_reasons.append(item.finish_reason)
        if item.finish_reason != FinishReason.UNSPECIFIED:
            self.done.set()


def stub_engine() -> tuple[Engine, LocalBlockAllocator]:
    return make_engine_without_model(
        NUM_BLOCKS, BLOCK_SIZE, StubRunner(), max_num_seqs=16, max_model_len=1024
    )


def indexed_request(index: int, max_new_tokens: int) -> EngineRequest:
    """Request ``r<index>``, whose prompt of 9 + index tokens differs from the others'."""
    prompt = [5 + (index * 7 + i) % 40 for i in range(9 + index)]
    return make_engine_request(f"r{index}", prompt, max_new_tokens, ignore_eos=True)


def submit_all(engine: Engine, max_new_tokens: int) -> tuple[list[Collector], list[FakeTrace]]:
    collectors, traces = [], []
    for index in range(NUM_REQUESTS):
        collectors.append(Collector(engine))
        traces.append(FakeTrace())
        engine.submit(indexed_request(index, max_new_tokens), collectors[-1], traces[-1])
    return collectors, traces


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def counter(registry: CollectorRegistry, kind: str, xid: str, severity: str) -> float | None:
    labels = {"type": kind, "xid": xid, "severity": severity}
    return registry.get_sample_value("zerolayer_gpu_events_total", labels)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "gpu.jsonl"
    path.write_text("")
    return path


def append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


def test_fatal_xid_ends_streams_within_one_step_frees_blocks_and_refuses(script: Path) -> None:
    engine, allocator = stub_engine()
    registry = CollectorRegistry()
    stopped: list[str] = []
    fault_steps: list[int] = []
    engine.start()
    fail = engine.fail

    def fail_and_record(error: Unavailable) -> None:
        fault_steps.append(engine.num_steps)  # steps done when the fault reached the engine
        fail(error)

    engine.fail = fail_and_record  # type: ignore[method-assign]
    monitors = watch_gpu(engine, registry, str(script), None, stopped.append)
    try:
        collectors, traces = submit_all(engine, max_new_tokens=500)
        wait_until(lambda: all(len(c.token_ids) >= 2 for c in collectors))
        assert allocator.num_free_blocks < NUM_BLOCKS
        append(script, '{"event": "xid", "data": 79}')
        for c in collectors:
            assert c.done.wait(10)
        message = (
            "GPU fatal event: Xid 79 (GPU has fallen off the bus); the scheduler stopped serving"
        )
        wait_until(lambda: stopped != [])  # stop_serving runs right after engine.fail
        assert stopped == [message]
        for c in collectors:
            assert isinstance(c.error, Unavailable) and str(c.error) == message
            # At most the step in progress completes: within one step.
            assert c.error_step is not None and c.error_step <= fault_steps[0] + 1
            assert len(c.token_ids) < 500
        # Aborted through the normal path: every block back in the pool, nothing held.
        assert allocator.num_free_blocks == NUM_BLOCKS
        assert allocator.ref_cnt == [0] * NUM_BLOCKS
        assert engine.stats().num_blocks_held == 0
        assert not engine.scheduler.has_unfinished_requests
        # The span event reached every request before it failed.
        event = GpuEvent(EventKind.XID, 79)
        expected = ("gpu event", span_attributes(event, classify_event(event)))
        assert all(t.events == [expected] for t in traces)
        # New requests are refused at once, with the same message.
        late = Collector(engine)
        engine.submit(indexed_request(0, 4), late)
        assert isinstance(late.error, Unavailable) and str(late.error) == message
        assert engine.not_serving_reason == message
        assert counter(registry, "xid", "79", "fatal") == 1.0
    finally:
        for monitor in monitors:
            monitor.stop()
        engine.stop()


def run_to_completion(script: Path | None, lines: list[str]) -> tuple[list[Collector], object]:
    engine, allocator = stub_engine()
    registry = CollectorRegistry()
    stopped: list[str] = []
    engine.start()
    monitors = (
        [] if script is None else watch_gpu(engine, registry, str(script), None, stopped.append)
    )
    try:
        collectors, traces = submit_all(engine, max_new_tokens=60)
        wait_until(lambda: all(len(c.token_ids) >= 2 for c in collectors))
        for line in lines:
            append(script, line)  # type: ignore[arg-type]
        for c in collectors:
            assert c.done.wait(20)
        if script is not None:
            wait_until(lambda: counter(registry, "pstate", "", "info") == 1.0)
        assert stopped == []
        assert engine.fault is None
        assert allocator.num_free_blocks == NUM_BLOCKS
        return collectors, (registry, traces)
    finally:
        for monitor in monitors:
            monitor.stop()
        engine.stop()


def test_recoverable_events_change_nothing_but_the_metric(script: Path, tmp_path: Path) -> None:
    lines = [
        '{"event": "xid", "data": 63}',
        '{"event": "xid", "data": 13}',
        '{"event": "single_bit_ecc"}',
        '{"event": "recovery_action", "data": 3}',
        '{"event": "pstate", "data": 2}',
    ]
    with_events, (registry, traces) = run_to_completion(script, lines)
    without, _ = run_to_completion(None, [])
    for a, b in zip(with_events, without, strict=True):
        assert a.error is None
        assert a.token_ids == b.token_ids and len(a.token_ids) == 60
        assert a.finish_reasons == b.finish_reasons
        assert a.finish_reasons[-1] == FinishReason.LENGTH
    assert counter(registry, "xid", "63", "recoverable") == 1.0
    assert counter(registry, "xid", "13", "application") == 1.0
    assert counter(registry, "single_bit_ecc", "", "recoverable") == 1.0
    assert counter(registry, "recovery_action", "", "recoverable") == 1.0
    assert counter(registry, "pstate", "", "info") == 1.0
    # Span events land on the requests that were in flight when they were applied.
    assert any(name == "gpu event" for t in traces for name, _ in t.events)


class ListSource:
    def __init__(self, events: list[GpuEvent]) -> None:
        self.events = list(events)
        self.closed = False

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        if self.events:
            return self.events.pop(0)
        time.sleep(timeout_ms / 1000)
        return None

    def close(self) -> None:
        self.closed = True


def test_only_the_first_fatal_event_stops_serving() -> None:
    registry = CollectorRegistry()
    faults: list[GpuFault] = []
    seen: list[str] = []
    source = ListSource(
        [GpuEvent(EventKind.XID, 48), GpuEvent(EventKind.XID, 79), GpuEvent(EventKind.XID, 45)]
    )
    monitor = GpuEventMonitor(
        source, registry, faults.append, lambda e, v: seen.append(v.description), 10
    )
    monitor.start()
    wait_until(lambda: len(seen) == 3)
    monitor.stop()
    assert source.closed
    assert [f.verdict.description for f in faults] == ["Xid 48 (double-bit ECC error)"]
    assert monitor.fault is faults[0]
    assert counter(registry, "xid", "48", "fatal") == 1.0
    assert counter(registry, "xid", "79", "fatal") == 1.0
    assert counter(registry, "xid", "45", "application") == 1.0


def test_a_failing_source_does_not_kill_the_thread() -> None:
    class Flaky(ListSource):
        def __init__(self) -> None:
            super().__init__([GpuEvent(EventKind.XID, 95)])
            self.calls = 0

        def wait(self, timeout_ms: int) -> GpuEvent | None:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("NVML hiccup")
            return super().wait(timeout_ms)

    faults: list[GpuFault] = []
    monitor = GpuEventMonitor(Flaky(), CollectorRegistry(), faults.append, None, 10)
    monitor.start()
    wait_until(lambda: faults != [], timeout_s=5)  # after the 1 s back-off
    monitor.stop()
    assert faults[0].message.startswith("GPU fatal event: Xid 95 (uncontained ECC error)")


def test_scripted_samples_move_the_poller_metrics(script: Path) -> None:
    registry = CollectorRegistry()
    poller = GpuPoller(ScriptedGpu(script), registry, interval_s=0.1)
    append(
        script,
        '{"sample": {"sm_utilization_percent": 50, "memory_used_bytes": 1000, '
        '"clock_event_reasons": 68}}',
    )
    poller.poll_once()
    append(
        script,
        '{"sample": {"sm_utilization_percent": 100, "memory_used_bytes": 3000, '
        '"clock_event_reasons": 64}}',
    )
    poller.poll_once()
    poller.poll_once()

    def value(name: str, labels: dict | None = None) -> float | None:
        return registry.get_sample_value(name, labels or {})

    throttled = "zerolayer_gpu_throttled_seconds_total"
    assert value(throttled, {"reason": "hw_thermal_slowdown"}) == pytest.approx(0.3)
    assert value(throttled, {"reason": "sw_power_cap"}) == pytest.approx(0.1)
    assert value("zerolayer_gpu_memory_used_bytes") == 3000
    # window 50, 100, 100: mean 83.33, pstdev 23.57
    assert value("zerolayer_gpu_sm_utilization_stability") == pytest.approx(
        1 - 23.570226039551585 / 83.33333333333333
    )
