"""OpenTelemetry tracing: setup from the standard ``OTEL_*`` variables, W3C trace context in gRPC
metadata, and a server interceptor that opens one SERVER span per call.

Configuration (OpenTelemetry SDK environment variables, read once at the process edge):
``OTEL_SDK_DISABLED=true`` turns tracing off; ``OTEL_TRACES_EXPORTER`` is ``otlp`` (OTLP over gRPC,
endpoint from ``OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT``, e.g. Jaeger's ``http://localhost:4317``),
``console`` or ``none``; when it is unset, tracing is on (otlp) only if an OTLP endpoint is set.
``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` name the process (default ``zerolayer-<layer>``).
Spans leave through a BatchSpanProcessor: a background thread with a bounded queue, so exporting
never blocks a request (spans are dropped, not waited for, when the queue is full); they are
flushed on shutdown for at most ``SHUTDOWN_FLUSH_S``; a failing export is logged once per outage
(:mod:`zerolayer.common.export_outage`). No global tracer provider is installed: the provider is
passed explicitly.
Attribute values OTLP cannot hold (an int outside int64, e.g. a uint64 seed) are exported as their
decimal string (:class:`OtlpSafeExporter`), so no attribute is dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes, AttributeValue

from zerolayer.common.export_outage import ExportOutageLog, OutageReportingExporter
from zerolayer.common.interceptors import Wrapping, WrappingInterceptor

SHUTDOWN_FLUSH_S = 1.0
"""Longest a layer waits at exit for its last spans to be exported, seconds (the OTLP exporter's
own timeout, 10 s by default, with retries, would hold up a stop by ~7 s with a dead collector)."""

# GenAI semantic conventions (opentelemetry semantic-conventions, gen-ai spans/attributes).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"


@dataclass(frozen=True)
class TracingConfig:
    """Which exporter, and the process's service name."""

    exporter: str
    """"otlp", "console" or "none"."""
    service_name: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str], layer: str) -> TracingConfig:
        """Reads the OTEL_* variables (see the module docstring)."""
        name = environ.get("OTEL_SERVICE_NAME") or f"zerolayer-{layer}"
        if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
            return cls("none", name)
        exporter = environ.get("OTEL_TRACES_EXPORTER", "").split(",")[0].strip().lower()
        if not exporter:
            endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
                "OTEL_EXPORTER_OTLP_ENDPOINT"
            )
            exporter = "otlp" if endpoint else "none"
        if exporter not in ("otlp", "console", "none"):
            raise ValueError(f"OTEL_TRACES_EXPORTER: {exporter!r} is not otlp, console or none")
        return cls(exporter, name)


class Tracing:
    """A tracer provider (or a no-op tracer when tracing is off) and W3C propagation."""

    def __init__(self, config: TracingConfig, exporter: SpanExporter | None = None) -> None:
        self.config = config
        self._provider: TracerProvider | None = None
        if exporter is None and config.exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        elif exporter is None and config.exporter == "console":
            exporter = ConsoleSpanExporter()
        if exporter is None:
            self.tracer: trace.Tracer = trace.NoOpTracer()
        else:
            resource = Resource.create({"service.name": config.service_name})
            self._provider = TracerProvider(resource=resource)
            outage = ExportOutageLog()
            outage.install()
            self._exporter = exporter
            self._provider.add_span_processor(
                BatchSpanProcessor(OutageReportingExporter(OtlpSafeExporter(exporter), outage))
            )
            self.tracer = self._provider.get_tracer("zerolayer")
        self._propagator = TraceContextTextMapPropagator()

    @property
    def enabled(self) -> bool:
        """True when spans are exported."""
        return self._provider is not None

    def inject(self, ctx: otel_context.Context | None = None) -> list[tuple[str, str]]:
        """gRPC metadata carrying ``ctx`` (default: the current context) as W3C traceparent."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=ctx)
        return list(carrier.items())

    def extract(self, metadata: Sequence[tuple[str, Any]] | None) -> otel_context.Context:
        """The trace context a caller sent in gRPC metadata (empty context if none)."""
        carrier = {k: v for k, v in (metadata or ()) if isinstance(v, str)}
        return self._propagator.extract(carrier)

    @contextmanager
    def client_span(self, full_method: str) -> Iterator[list[tuple[str, str]]]:
        """A CLIENT span around an outgoing call; yields the metadata that carries it.

        The span is a child of the current context but is not made current itself: the block
        may be an async generator that asyncio closes from another task's context on
        cancellation, where detaching a context token would fail.
        """
        service, _, method = full_method.strip("/").partition("/")
        span = self.tracer.start_span(
            full_method.strip("/"),
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
        )
        try:
            yield self.inject(trace.set_span_in_context(span))
        except GeneratorExit:
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            span.end()

    def shutdown(self) -> None:
        """Flushes pending spans for at most :data:`SHUTDOWN_FLUSH_S` and stops the exporter
        (an export in progress is abandoned: a dead collector does not hold up the exit)."""
        if self._provider is None:
            return
        # NOTE: the SDK's shutdown waits up to 30 s for the batch processor's worker, whose export
        # retries a dead collector until the exporter's own timeout; stopping the exporter ends
        # them (and its call in flight).
        flushing = threading.Thread(target=self._provider.shutdown, name="span-flush", daemon=True)
        flushing.start()
        flushing.join(SHUTDOWN_FLUSH_S)
        if flushing.is_alive():
            self._exporter.shutdown()
            flushing.join(SHUTDOWN_FLUSH_S)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range of OTLP's integer attribute value (``AnyValue.int_value``, an int64)."""


def otlp_safe_value(value: AttributeValue) -> AttributeValue:
    """``value`` as OTLP can hold it losslessly: an int outside int64 (or a sequence holding
    one) becomes its decimal string (each element's, so the sequence stays homogeneous);
    anything else is returned as it is."""
    if _out_of_int64(value):
        return str(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        if any(_out_of_int64(v) for v in value):
            return tuple(str(v) for v in value)
    return value


def otlp_safe_attributes(attributes: Attributes) -> Attributes:
    """``attributes`` with each value made :func:`otlp_safe_value`; the same object when none
    needs it."""
    if not attributes:
        return attributes
    safe = {key: otlp_safe_value(value) for key, value in attributes.items()}
    changed = any(safe[key] is not value for key, value in attributes.items())
    return safe if changed else attributes


def _out_of_int64(value: object) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and not INT64_MIN <= value <= INT64_MAX
    )


class OtlpSafeExporter(SpanExporter):
    """Passes spans on to ``exporter`` with every attribute (of the span, its events and links)
    made :func:`otlp_safe_attributes`: the OTLP encoder would otherwise drop the attribute and
    log a traceback ("Value out of range") for each span. Spans that need nothing are passed on
    as they are."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Exports ``spans`` through the wrapped exporter."""
        return self._exporter.export([_otlp_safe_span(span) for span in spans])

    def shutdown(self) -> None:
        """Shuts the wrapped exporter down."""
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flushes the wrapped exporter."""
        return self._exporter.force_flush(timeout_millis)


def _otlp_safe_span(span: ReadableSpan) -> ReadableSpan:
    read = span.attributes  # NOTE: a fresh read-only view at each read
    attributes = otlp_safe_attributes(read)
    events = [_otlp_safe_event(event) for event in span.events]
    links = [_otlp_safe_link(link) for link in span.links]
    pairs = zip((*events, *links), (*span.events, *span.links), strict=True)
    if attributes is read and all(safe is given for safe, given in pairs):
        return span
    # NOTE: the copy no longer knows how many attributes, events and links the limits dropped.
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=events,
        links=links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _otlp_safe_event(event: Event) -> Event:
    safe = otlp_safe_attributes(event.attributes)
    return event if safe is event.attributes else Event(event.name, safe, event.timestamp)


def _otlp_safe_link(link: Link) -> Link:
    safe = otlp_safe_attributes(link.attributes)
    return link if safe is link.attributes else Link(link.context, safe)


def now_ns() -> int:
    """Wall-clock time in nanoseconds (the clock OpenTelemetry timestamps use)."""
    return time.time_ns()


class TracingServerInterceptor(WrappingInterceptor):
    """Opens a SERVER span for the calls of zerolayer's and KServe's services (any kind of
    method), child of the caller's trace context (from its metadata), current while the handler
    runs. Errors set the span status.

    A call whose caller sent no trace context starts a trace of its own only where the server
    ``starts_traces`` (the public frontend: each client request is a trace). The internal layers
    only continue their caller's trace: a call made outside any request or start-up (the engine's
    per-step CommitBlocks, the kvstore lease's keep-alive, the frontend's GetStats) makes no span,
    where it would otherwise be a one-span trace of its own.
    """

    def __init__(
        self, tracing: Tracing, starts_traces: bool = False, prefix: str = "/zerolayer."
    ) -> None:
        super().__init__((prefix, "/inference."))
        self._tracing = tracing
        self._starts_traces = starts_traces

    def wrapping(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> Wrapping | None:
        """A span around each call; None while tracing is off, or for a call that carries no
        trace context where this server does not start traces."""
        if not self._tracing.enabled:
            return None
        parent = self._tracing.extract(details.invocation_metadata)
        if (
            not self._starts_traces
            and not trace.get_current_span(parent).get_span_context().is_valid
        ):
            return None
        name = details.method.strip("/")
        service, _, method = name.partition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        tracer = self._tracing.tracer

        @asynccontextmanager
        async def span(context: grpc.aio.ServicerContext) -> AsyncIterator[trace.Span]:
            with tracer.start_as_current_span(
                name,
                context=parent,
                kind=SpanKind.SERVER,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as s:
                try:
                    yield s
                except BaseException as exc:
                    s.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                    raise

        return Wrapping(around=span)
