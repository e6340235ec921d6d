"""End to end with a scripted GPU: the real four processes, the scheduler started with the test-only
``--nvml-script`` so its GPU event thread and poller read a JSON-lines file this test appends to.

A throttle sample moves the GPU metrics; a recoverable Xid during 8 streams changes nothing but
the counter; a fatal Xid ends the 8 streams with UNAVAILABLE naming the Xid, flips the scheduler's
health to NOT_SERVING, refuses new requests, frees every KV block in the kvstore, and the
launcher's supervisor logs why.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from e2e.stack import free_port, kv_stats, running_stack, scheduler_stats, text_stub
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc

pytestmark = pytest.mark.e2e

NUM_STREAMS = 8
MAX_NEW_TOKENS = 800
"""Long enough to still run when the events arrive; 8 such streams fit the test arena."""


def append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


def scrape(stack, layer: str) -> dict[str, float]:
    port = stack.config.metrics_port(layer)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        canonical(line.rsplit(" ", 1)[0]): float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def canonical(sample: str) -> str:
    """``name{b="1",a="2"}`` -> ``name{a="2",b="1"}`` (exposition label order is not fixed)."""
    name, brace, labels = sample.partition("{")
    if not brace:
        return name
    return name + "{" + ",".join(sorted(labels.rstrip("}").split(","))) + "}"


def wait_for(condition, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def scheduler_health(stack) -> int:
    with grpc.insecure_channel(stack.address("scheduler")) as channel:
        request = health_pb2.HealthCheckRequest(service="")
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


class Stream(threading.Thread):
    """One GenerateStream through the frontend, read to its end or its error."""

    def __init__(self, stub, index: int) -> None:
        super().__init__(daemon=True)
        self.request = pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=[1, *range(10 + index, 30 + index)]),
            max_new_tokens=MAX_NEW_TOKENS,
            ignore_eos=True,
        )
        self.stub = stub
        self.num_tokens = 0
        self.error: grpc.RpcError | None = None
        self.started = threading.Event()

    def run(self) -> None:
        try:
            for chunk in self.stub.GenerateStream(self.request):
                self.num_tokens += len(chunk.token_ids)
                self.started.set()
        except grpc.RpcError as exc:
            self.error = exc


def test_gpu_events_on_the_real_stack(
    dummy_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = tmp_path / "gpu.jsonl"
    script.write_text("")
    caplog.set_level(logging.INFO, logger="zerolayer.stack.health_watch")
    with running_stack(
        dummy_model_dir, tmp_path / "logs", nvml_script=str(script), metrics_port_base=free_port()
    ) as stack:
        # Polled signals: a throttled sample moves the throttle seconds and memory gauges.
        append(
            script,
            '{"sample": {"sm_utilization_percent": 75, "memory_used_bytes": 123456789, '
            '"clock_event_reasons": 64}}',
        )
        throttled = 'zerolayer_gpu_throttled_seconds_total{reason="hw_thermal_slowdown"}'
        wait_for(lambda: scrape(stack, "scheduler").get(throttled, 0) >= 0.2, what="throttle")
        metrics = scrape(stack, "scheduler")
        assert metrics["zerolayer_gpu_memory_used_bytes"] == 123456789
        assert metrics["zerolayer_gpu_sm_utilization_percent"] == 75
        assert "zerolayer_gpu_sm_utilization_stability" in metrics

        stub = text_stub(stack)
        streams = [Stream(stub, i) for i in range(NUM_STREAMS)]
        for stream in streams:
            stream.start()
        for stream in streams:
            assert stream.started.wait(30)

        # A recoverable Xid: counted, serving continues.
        append(script, '{"event": "xid", "data": 63}')
        recoverable = canonical(
            'zerolayer_gpu_events_total{type="xid",xid="63",severity="recoverable"}'
        )
        wait_for(lambda: scrape(stack, "scheduler").get(recoverable) == 1.0, what="Xid 63")
        assert scheduler_health(stack) == health_pb2.HealthCheckResponse.SERVING
        assert all(s.is_alive() and s.error is None for s in streams), "streams ended too early"

        # A fatal Xid: every stream ends with UNAVAILABLE naming it.
        append(script, '{"event": "xid", "data": 79}')
        for stream in streams:
            stream.join(timeout=30)
            assert not stream.is_alive()
            assert stream.error is not None
            assert stream.error.code() == grpc.StatusCode.UNAVAILABLE
            assert "Xid 79 (GPU has fallen off the bus)" in stream.error.details()
            assert 0 < stream.num_tokens < MAX_NEW_TOKENS

        assert scheduler_health(stack) == health_pb2.HealthCheckResponse.NOT_SERVING
        reason = scheduler_stats(stack).not_serving_reason
        assert reason.startswith("GPU fatal event: Xid 79 (GPU has fallen off the bus)")
        fatal = canonical('zerolayer_gpu_events_total{type="xid",xid="79",severity="fatal"}')
        assert scrape(stack, "scheduler")[fatal] == 1.0

        # New requests are refused: at the scheduler at once, through the frontend too.
        with grpc.insecure_channel(stack.address("scheduler")) as channel:
            late = scheduler_pb2.EngineRequest(
                request_id="late",
                prompt_token_ids=[1, 2, 3],
                max_new_tokens=4,
                sampling=scheduler_pb2.SamplingParams(top_p=1.0),
            )
            with pytest.raises(grpc.RpcError) as refused:
                list(scheduler_pb2_grpc.SchedulerStub(channel).Generate(late, timeout=10))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Xid 79" in refused.value.details()
        with pytest.raises(grpc.RpcError) as refused:
            stub.Generate(pb.GenerateRequest(prompt="after", max_new_tokens=4), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Xid 79" in refused.value.details()

        # The ended streams' blocks are free in the kvstore.
        wait_for(lambda: kv_stats(stack).num_blocks_used == 0, what="blocks freed")

        # The supervisor says why the scheduler stopped serving.
        def supervisor_said() -> bool:
            return any(
                r.levelno == logging.ERROR
                and "zerolayer: scheduler" in r.getMessage()
                and "stopped serving: GPU fatal event: Xid 79" in r.getMessage()
                for r in caplog.records
            )

        wait_for(supervisor_said, what="the supervisor's log line")
