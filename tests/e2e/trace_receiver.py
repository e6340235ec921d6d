"""An OTLP/gRPC trace receiver run in the test process: the layers export their spans to it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Collects exported spans as (service name, span)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, trace_pb2.Span]] = []
        self._lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 - gRPC method name
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope in resource_spans.scope_spans:
                    self.spans.extend((service, s) for s in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> list[tuple[str, trace_pb2.Span]]:
        with self._lock:
            return list(self.spans)


@contextmanager
def running_receiver() -> Iterator[tuple[Receiver, int]]:
    """A :class:`Receiver` served on a free port of 127.0.0.1: (receiver, port)."""
    servicer = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(0)


def tracing_env(port: int) -> dict[str, str]:
    """The environment that makes every layer export its spans to a receiver on ``port``
    (OpenTelemetry's own variables; the batch processor exports every 100 ms)."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
