"""What one call of a public HTTP API (OpenAI's, Anthropic's) leaves behind: its SERVER span and
its count in the frontend's request metrics (``zerolayer_frontend_requests_total{method,code}``,
the method the route, e.g. ``/v1/completions``, the code the name of the gRPC status code the
same outcome has on the gRPC port, so that both ports' calls add up; in
``zerolayer_frontend_requests_in_flight{method}`` until it ends); and the HTTP status of each
gRPC status code, mapped as google.rpc.Code documents
(https://github.com/googleapis/googleapis/blob/master/google/rpc/code.proto)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from zerolayer.common.tracing import Tracing
from zerolayer.frontend.metrics import FrontendMetrics

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""HTTP status of a gRPC status code; any other: 500."""


@dataclass(frozen=True)
class HttpError:
    """An error answer: its HTTP status and the API's body (OpenAI's and Anthropic's both keep
    the message at ``body["error"]["message"]``)."""

    status: int
    body: dict
    grpc_code: str
    """The name of the gRPC status code the same error has (the frontend's request metrics)."""

    @property
    def message(self) -> str:
        return str(self.body["error"]["message"])


def grpc_code_of(status: int) -> grpc.StatusCode:
    """The first gRPC code of :data:`HTTP_STATUS` answered with the HTTP ``status`` (INTERNAL if
    none)."""
    return next((c for c, s in HTTP_STATUS.items() if s == status), grpc.StatusCode.INTERNAL)


@dataclass(frozen=True)
class CallRecord:
    """The span and count of one call, in flight from its creation; :meth:`ended` exactly
    once."""

    span: trace.Span
    """Not current: :meth:`current` makes it so around the work it covers."""
    method: str
    """The route, the ``method`` label."""
    metrics: FrontendMetrics | None

    def __post_init__(self) -> None:
        if self.metrics is not None:
            self.metrics.in_flight.labels(self.method).inc()

    def current(self) -> trace.Span:
        """A context manager that makes the span current (and does not end it)."""
        return trace.use_span(self.span, end_on_exit=False)  # type: ignore[return-value]

    def ended(self, status: int, code: str, error: str = "") -> None:
        """Ends the span (an ERROR with ``error`` when given) and counts the call.

        Args:
            status: the HTTP status sent.
            code: the gRPC status code name of the outcome ("OK", "CANCELLED", ...).
        """
        if error:
            self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.set_attribute("http.response.status_code", status)
        self.span.end()
        if self.metrics is not None:
            self.metrics.requests.labels(self.method, code).inc()
            self.metrics.in_flight.labels(self.method).dec()

    def answered(self, error: HttpError | None, response: Response | None = None) -> Response:
        """:meth:`ended` with ``error``'s answer, or with the (200) ``response``; the answer."""
        if error is None:
            assert response is not None
            self.ended(response.status_code, "OK")
            return response
        self.ended(error.status, error.grpc_code, error.message)
        return JSONResponse(error.body, status_code=error.status)


def start_call(
    request: Request, tracing: Tracing | None, metrics: FrontendMetrics | None
) -> CallRecord:
    """The record of a generation call: a SERVER span in the caller's trace (W3C
    ``traceparent``), none without ``tracing``."""
    path = request.url.path
    span: trace.Span = trace.INVALID_SPAN
    if tracing is not None:
        span = tracing.tracer.start_span(
            f"POST {path}",
            context=tracing.extract(list(request.headers.items())),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "url.path": path},
        )
    return CallRecord(span, path, metrics)
