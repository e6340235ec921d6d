"""What one call of the OpenAI-compatible API leaves behind: its SERVER span and its count in
the frontend's request metrics (``zerolayer_frontend_requests_total{method,code}``, the method
the route, e.g. ``/v1/completions``, the code the name of the gRPC status code the same outcome
has on the gRPC port, so that both ports' calls add up; in
``zerolayer_frontend_requests_in_flight{method}`` until it ends)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import JSONResponse, Response
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from zerolayer.frontend.metrics import FrontendMetrics
from zerolayer.frontend.openai.errors import HttpError


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
        self.ended(error.status, error.grpc_code, str(error.body["error"]["message"]))
        return JSONResponse(error.body, status_code=error.status)
