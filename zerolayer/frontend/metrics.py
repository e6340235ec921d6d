"""Prometheus metrics of the frontend: requests by method and status, and the latencies a client
sees (TTFT, inter-token latency, end to end) measured at the public endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from zerolayer.common.interceptors import Wrapping, WrappingInterceptor
from zerolayer.common.metrics import LATENCY_BUCKETS_S
from zerolayer.common.status import status_of


class FrontendMetrics:
    """The frontend's metrics in a private registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "zerolayer_frontend_"
        self.requests = Counter(
            p + "requests",
            "Public calls by method and status code",
            ["method", "code"],
            registry=registry,
        )
        self.ttft = Histogram(
            p + "ttft_seconds",
            "Request received to first token sent",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.itl = Histogram(
            p + "itl_seconds",
            "Gap between token-carrying responses",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.e2e = Histogram(
            p + "e2e_seconds",
            "Request received to last response",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )


def _code(exc: BaseException, context: grpc.aio.ServicerContext) -> str:
    """The status code of a call whose handler raised ``exc``."""
    if isinstance(exc, grpc.aio.AbortError):  # the status was sent with context.abort
        code = context.code()
        return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    # NOTE: gRPC cancels the handler's task both when the client cancels and when the deadline
    # passes; a stream the client left between two messages is closed (GeneratorExit) instead.
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        remaining = context.time_remaining()
        return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
    if isinstance(exc, Exception):  # what the error mapping outside will answer
        return status_of(exc).code.name
    return "UNKNOWN"


class RequestCountingInterceptor(WrappingInterceptor):
    """Counts every public call (any kind of method) by method and final status code (placed
    inside error mapping, so it sees the domain error that decides the code)."""

    def __init__(self, metrics: FrontendMetrics, prefixes: tuple[str, ...]) -> None:
        super().__init__(prefixes)
        self._metrics = metrics

    def wrapping(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> Wrapping:
        """A count of each call once it ends."""
        counter = self._metrics.requests
        method = details.method.rsplit("/", 1)[-1]

        @asynccontextmanager
        async def counted(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
            try:
                yield
            except BaseException as exc:
                counter.labels(method, _code(exc, context)).inc()
                raise
            counter.labels(method, "OK").inc()

        return Wrapping(around=counted)
