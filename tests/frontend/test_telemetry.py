"""The frontend's latency histograms record what the client sees: a streamed call's first token
and gaps between its responses, a unary call's one response (read from the metrics' registry)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from zerolayer.common.generation import FinishReason, GenerationChunk, Usage
from zerolayer.frontend.metrics import FrontendMetrics
from zerolayer.frontend.telemetry import GenerationTelemetry


def latencies(registry: CollectorRegistry) -> dict[str, float]:
    """Count and sum of the TTFT, ITL and e2e histograms, e.g. ``ttft_count``."""
    return {
        s.name.removeprefix("zerolayer_frontend_").replace("_seconds", ""): s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name.endswith(("_seconds_count", "_seconds_sum"))
    }


def send(stream: bool, num_chunks: int) -> dict[str, float]:
    """The latencies recorded for one generation sent as ``num_chunks`` one-token chunks."""
    registry = CollectorRegistry()
    telemetry = GenerationTelemetry(
        trace.NoOpTracer(), FrontendMetrics(registry), "model", stream=stream
    )
    for i in range(num_chunks - 1):
        telemetry.sent(GenerationChunk("r", "x", (i,)))
    telemetry.sent(GenerationChunk("r", "x", (9,), FinishReason.LENGTH, Usage(3, num_chunks, 0)))
    return latencies(registry)


@pytest.mark.parametrize("num_chunks", [1, 5])
def test_a_streamed_generation_records_its_first_token_and_each_gap(num_chunks) -> None:
    recorded = send(stream=True, num_chunks=num_chunks)
    assert (recorded["ttft_count"], recorded["itl_count"]) == (1, num_chunks - 1)
    assert recorded["e2e_count"] == 1
    assert recorded["ttft_sum"] <= recorded["e2e_sum"]


@pytest.mark.parametrize("num_chunks", [1, 5])
def test_a_unary_generation_records_its_one_response_as_first_token_and_end(num_chunks) -> None:
    # The client gets every token at once: TTFT is the whole call, and there are no gaps.
    recorded = send(stream=False, num_chunks=num_chunks)
    assert (recorded["ttft_count"], recorded["itl_count"], recorded["e2e_count"]) == (1, 0, 1)
    assert recorded["ttft_sum"] == recorded["e2e_sum"]
