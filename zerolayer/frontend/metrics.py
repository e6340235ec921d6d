"""Prometheus metrics of the frontend: requests by method and status, requests in flight, whether
the frontend serves, and the latencies a client sees (TTFT, inter-token latency, end to end)
measured at the public endpoint.

The latencies are what the client sees (see zerolayer.frontend.telemetry): a streamed call
(GenerateStream, ``stream: true`` over HTTP, a KServe stream request with ``stream`` set) has its
first token at its first token-carrying response and an inter-token gap between each two of them;
a unary call (Generate, ModelInfer, non-streamed HTTP) gets every token in its one response, so its
TTFT is its end-to-end latency and it has no inter-token gaps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.in_flight = Gauge(
            p + "requests_in_flight",
            "Public calls started and not yet ended, by method (gRPC method or HTTP route)",
            ["method"],
            registry=registry,
        )
        self.serving = Gauge(
            p + "serving",
            "1 while the frontend's public gRPC health says SERVING (it serves and some "
            "scheduler takes requests), 0 otherwise",
            registry=registry,
        )
        self.ttft = Histogram(
            p + "ttft_seconds",
            "Generation request received to its first token sent, seconds: a streamed call's "
            "first token-carrying response, a unary call's one response",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.itl = Histogram(
            p + "itl_seconds",
            "Gap between two token-carrying responses of a streamed generation, seconds "
            "(unary calls have none)",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.e2e = Histogram(
            p + "e2e_seconds",
            "Generation request received to its last response sent, seconds",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )


DEADLINE_SLACK_S = 0.1
"""A call cancelled less than this many seconds (plus :data:`TIMEOUT_ROUNDING` of its timeout)
before its deadline, or after it, is counted as DEADLINE_EXCEEDED: the server cannot tell the two
apart that close to the deadline (see :func:`_code`)."""

TIMEOUT_ROUNDING = 0.01
"""How much later than the client's the server's deadline can be, as a fraction of the timeout:
gRPC's C core (Python's, C++'s clients) rounds the ``grpc-timeout`` header it sends up to 3
significant digits (to 1 ms under 1 s, 10 ms under 10 s, 100 ms under 100 s, 1 s under 1000 s,
...), so by less than 1 % (grpc ``src/core/lib/transport/timeout_encoding.cc``; the header's
format: https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md)."""


def deadline_slack_s(timeout_s: float) -> float:
    """How long before the server's deadline a cancellation may still be the client's deadline,
    seconds, for a call that had ``timeout_s`` seconds left when its handler started (see
    :data:`DEADLINE_SLACK_S`, :data:`TIMEOUT_ROUNDING`)."""
    return DEADLINE_SLACK_S + TIMEOUT_ROUNDING * timeout_s


def _code(exc: BaseException, context: grpc.aio.ServicerContext, timeout_s: float | None) -> str:
    """The status code of a call whose handler raised ``exc``; ``timeout_s``: the time the call
    had left when its handler started (None: no deadline), seconds."""
    if isinstance(exc, grpc.aio.AbortError):  # the status was sent with context.abort
        code = context.code()
        return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    # NOTE: gRPC cancels the handler's task both when the client cancels and when the deadline
    # passes (a response stream whose message could not be sent ends the same way, see
    # zerolayer.common.interceptors._write). gRPC tells the handler only "cancelled" (the
    # core's close-on-server op), never why, so the time left decides. Not "<= 0": the
    # server's deadline is later than the client's by the request headers' transit time and
    # by the rounding up of the grpc-timeout header (up to 100 ms for a 30 s timeout, 1 s for
    # a 300 s one), so when the client's own deadline timer fires first, its cancellation
    # arrives while time_remaining() still reads above 0 (seen under load: 10.001 s deadlines
    # cancelled with 85 ms left; in-process, tens of microseconds). The slack trades that for
    # counting a client's cancel in the last deadline_slack_s() before its deadline as the
    # deadline's.
    if isinstance(exc, asyncio.CancelledError):
        remaining = context.time_remaining()
        if timeout_s is None or remaining is None or remaining >= deadline_slack_s(timeout_s):
            return "CANCELLED"
        return "DEADLINE_EXCEEDED"
    if isinstance(exc, Exception):  # what the error mapping outside will answer
        return status_of(exc).code.name
    return "UNKNOWN"


class RequestCountingInterceptor(WrappingInterceptor):
    """Counts every public call (any kind of method) by method and final status code (placed
    inside error mapping, so it sees the domain error that decides the code), and the calls in
    flight by method."""

    def __init__(self, metrics: FrontendMetrics, prefixes: tuple[str, ...]) -> None:
        super().__init__(prefixes)
        self._metrics = metrics

    def wrapping(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> Wrapping:
        """A count of each call once it ends; in flight while its handler runs."""
        counter = self._metrics.requests
        method = details.method.rsplit("/", 1)[-1]
        in_flight = self._metrics.in_flight.labels(method)

        @asynccontextmanager
        async def counted(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
            timeout_s = context.time_remaining()
            in_flight.inc()
            try:
                yield
            except BaseException as exc:
                counter.labels(method, _code(exc, context, timeout_s)).inc()
                raise
            else:
                counter.labels(method, "OK").inc()
            finally:
                in_flight.dec()

        return Wrapping(around=counted)
