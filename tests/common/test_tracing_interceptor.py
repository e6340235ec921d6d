"""Which calls the tracing server interceptor traces: the public frontend starts a trace for a
call without trace context; the internal layers only continue their caller's."""

from __future__ import annotations

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from zerolayer.common.tracing import Tracing, TracingConfig, TracingServerInterceptor

TRACEPARENT = ("traceparent", f"00-{0xAB:032x}-{0xCD:016x}-01")


class Details(grpc.HandlerCallDetails):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = "/zerolayer.v1.KVStore/Free"
        self.invocation_metadata = metadata


async def handler(request: object, context: object) -> object:
    return request


@pytest.mark.parametrize(
    ("starts_traces", "metadata", "traced"),
    [
        (False, (), False),  # an internal layer's call outside any trace: no one-span trace
        (False, (TRACEPARENT,), True),
        (True, (), True),  # a public call starts its trace
        (True, (TRACEPARENT,), True),
    ],
)
def test_a_call_is_traced_when_it_carries_a_trace_or_the_server_starts_traces(
    starts_traces: bool, metadata: tuple, traced: bool
) -> None:
    tracing = Tracing(TracingConfig("none", "test"), exporter=InMemorySpanExporter())
    interceptor = TracingServerInterceptor(tracing, starts_traces)
    method = grpc.unary_unary_rpc_method_handler(handler)
    assert (interceptor.wrapping(method, Details(metadata)) is not None) == traced
    tracing.shutdown()
