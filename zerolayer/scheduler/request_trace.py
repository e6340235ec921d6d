"""The spans of one request inside the scheduler: queue, context load, prefill, decode.

Loading (queue wait, then *context load*: the prefix-cache lookup and block allocation, whose
kvstore calls are its children) and inference (*prefill* up to the first token, then *decode*) are
separate INTERNAL spans under the scheduler's SERVER span, so a trace viewer shows where time went
instead of one opaque call. The engine thread records timestamps; queue, prefill and decode spans
are emitted with explicit start and end times, context load is live (current while the kvstore is
called, so those CLIENT spans nest under it). The kvstore calls made later for this request alone
(an allocation during decode, the free at its end) are children of the SERVER span
(:meth:`RequestTrace.attached`); the per-step CommitBlocks, one call for the blocks of many
requests, belongs to no request and is not traced.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from zerolayer.common.generation import FinishReason
from zerolayer.common.tracing import (
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    Tracing,
    now_ns,
)


class RequestTrace:
    """Timestamps and spans of one request (driven by the engine thread); implements
    :class:`zerolayer.scheduler.core.trace.RequestTraceHooks`."""

    def __init__(self, tracing: Tracing, parent: otel_context.Context) -> None:
        self._tracer = tracing.tracer
        self._parent = parent
        self.arrival_ns = now_ns()
        self.queue_ended_ns: int | None = None
        self.context_loaded_ns: int | None = None
        self.first_token_ns: int | None = None
        self.num_prefill_tokens = 0
        self._load_span: Span | None = None

    @contextmanager
    def context_load(self) -> Iterator[None]:
        """A live span around an admission attempt's lookup and allocation, until one succeeds
        (:meth:`admitted`); the queue span ends where the first attempt starts."""
        if self.context_loaded_ns is not None:
            yield
            return
        start = now_ns()
        if self.queue_ended_ns is None:
            self.queue_ended_ns = start
            self._tracer.start_span(
                "queue", context=self._parent, kind=SpanKind.INTERNAL, start_time=self.arrival_ns
            ).end(end_time=start)
        with self._tracer.start_as_current_span(
            "context load", context=self._parent, kind=SpanKind.INTERNAL, start_time=start
        ) as span:
            self._load_span = span
            try:
                yield
            finally:
                self._load_span = None

    @contextmanager
    def attached(self) -> Iterator[None]:
        """Makes the request's context (its scheduler SERVER span) current on this thread
        around a kvstore call made for this request alone (an allocation during decode, a
        free), so that its CLIENT span, and the kvstore's SERVER span, join the request's trace;
        inside :meth:`context_load` the live context load span stays current."""
        if self._load_span is not None:
            yield
            return
        token = otel_context.attach(self._parent)
        try:
            yield
        finally:
            otel_context.detach(token)

    def admitted(self) -> None:
        """The request got its blocks: prefill starts now."""
        if self.context_loaded_ns is None:
            self.context_loaded_ns = now_ns()

    def set_context(
        self, num_prompt_tokens: int, num_cached_tokens: int, num_pinned_tokens: int = 0
    ) -> None:
        """Records on the live context load span (if any) how much of the prompt came from the
        prefix cache, and how much of that a kvstore pin held (``zerolayer.pinned_tokens``: a
        pinned-prefix hit is loading, not inference)."""
        span = self._load_span
        if span is not None:
            span.set_attribute("zerolayer.prompt_tokens", num_prompt_tokens)
            span.set_attribute("zerolayer.cached_tokens", num_cached_tokens)
            span.set_attribute("zerolayer.pinned_tokens", num_pinned_tokens)
            span.set_attribute("zerolayer.uncached_tokens", num_prompt_tokens - num_cached_tokens)

    def add_event(self, name: str, attributes: Mapping[str, str | int]) -> None:
        """Adds an event to the request's live server span (e.g. a GPU event while it ran)."""
        trace.get_current_span(self._parent).add_event(name, attributes)

    def first_token(self) -> None:
        """Marks the end of prefill."""
        if self.first_token_ns is None:
            self.first_token_ns = now_ns()

    def finished(
        self,
        reason: FinishReason,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        num_output_tokens: int,
        num_preemptions: int,
    ) -> None:
        """Emits the prefill and decode spans."""
        end = now_ns()
        start = self.context_loaded_ns or self.arrival_ns
        first = self.first_token_ns or end
        self._tracer.start_span(
            "prefill",
            context=self._parent,
            kind=SpanKind.INTERNAL,
            start_time=start,
            attributes={
                GEN_AI_USAGE_INPUT_TOKENS: num_prompt_tokens,
                GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: num_cached_tokens,
                "zerolayer.prefill_tokens": num_prompt_tokens - num_cached_tokens,
            },
        ).end(end_time=first)
        if self.first_token_ns is not None:
            self._tracer.start_span(
                "decode",
                context=self._parent,
                kind=SpanKind.INTERNAL,
                start_time=first,
                attributes={
                    GEN_AI_USAGE_OUTPUT_TOKENS: num_output_tokens,
                    GEN_AI_RESPONSE_FINISH_REASONS: [reason.name.lower()],
                    "zerolayer.preemptions": num_preemptions,
                },
            ).end(end_time=end)
