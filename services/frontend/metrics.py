"""Prometheus metrics of the frontend: requests by method and status, and the latencies a client
sees (TTFT, inter-token latency, end to end) measured at the public endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common.errors import ZerolayerError
from services.common.metrics import LATENCY_BUCKETS_S


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
    if isinstance(exc, ZerolayerError):
        return exc.code.name
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code().name
    if isinstance(exc, grpc.aio.AbortError):  # the status was sent with context.abort
        code = context.code()
        return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    # NOTE: gRPC cancels the handler's task both when the client cancels and when the deadline
    # passes; a stream the client left between two messages is closed (GeneratorExit) instead.
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        remaining = context.time_remaining()
        return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
    return "UNKNOWN"


class RequestCountingInterceptor(grpc.aio.ServerInterceptor):
    """Counts every public call by method and final status code (placed inside error mapping, so
    it sees the domain error that decides the code)."""

    def __init__(self, metrics: FrontendMetrics, prefixes: tuple[str, ...]) -> None:
        self._metrics = metrics
        self._prefixes = prefixes

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self._prefixes):
            return handler
        method = details.method.rsplit("/", 1)[-1]
        counter = self._metrics.requests
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    response = await inner(request, context)
                except BaseException as exc:
                    counter.labels(method, _code(exc, context)).inc()
                    raise
                counter.labels(method, "OK").inc()
                return response

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
                try:
                    async for item in inner_stream(request, context):
                        yield item
                except BaseException as exc:
                    counter.labels(method, _code(exc, context)).inc()
                    raise
                counter.labels(method, "OK").inc()

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        return handler
