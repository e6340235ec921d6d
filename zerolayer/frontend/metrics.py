"""Prometheus metrics of the frontend: requests by method and status, and the latencies a client
sees (TTFT, inter-token latency, end to end) measured at the public endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from zerolayer.common.errors import ZerolayerError
from zerolayer.common.metrics import LATENCY_BUCKETS_S


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
        # NOTE: the request (or request iterator) passes through untouched, so one wrapper serves
        # both request kinds; the response kind decides whether the handler is awaited or iterated.
        for kind, counted, wrap in (
            ("unary_unary", _counted_call, grpc.unary_unary_rpc_method_handler),
            ("stream_unary", _counted_call, grpc.stream_unary_rpc_method_handler),
            ("unary_stream", _counted_stream, grpc.unary_stream_rpc_method_handler),
            ("stream_stream", _counted_stream, grpc.stream_stream_rpc_method_handler),
        ):
            inner = getattr(handler, kind)
            if inner is not None:
                call = counted(inner, self._metrics.requests, method)
                return wrap(call, handler.request_deserializer, handler.response_serializer)
        return handler


def _counted_call(inner: Callable[..., Awaitable[Any]], counter: Counter, method: str) -> Callable:
    """``inner`` (a handler with one response) counting its call once, by final status code."""

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            response = await inner(request, context)
        except BaseException as exc:
            counter.labels(method, _code(exc, context)).inc()
            raise
        counter.labels(method, "OK").inc()
        return response

    return call


def _counted_stream(inner: Callable[..., AsyncIterator], counter: Counter, method: str) -> Callable:
    """``inner`` (a handler with a response stream) counting its call once, by final status code."""

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
        try:
            async for item in inner(request, context):
                yield item
        except BaseException as exc:
            counter.labels(method, _code(exc, context)).inc()
            raise
        counter.labels(method, "OK").inc()

    return stream
