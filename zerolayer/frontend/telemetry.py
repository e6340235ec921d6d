"""Spans and metrics of one public generation request at the frontend.

The SERVER span (opened by the tracing interceptor) gets the OpenTelemetry GenAI attributes
(``gen_ai.request.*``, ``gen_ai.usage.*``, ``gen_ai.response.*``); *tokenize* and *detokenize* are
INTERNAL children. Detokenization happens piecewise while tokens stream in, so its span runs from
the first to the last piece and carries the time actually spent detokenizing as an attribute.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from zerolayer.common.generation import EngineRequest, FinishReason, GenerationChunk
from zerolayer.common.tracing import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_SEED,
    GEN_AI_REQUEST_STREAM,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_K,
    GEN_AI_REQUEST_TOP_P,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    now_ns,
)
from zerolayer.frontend.metrics import FrontendMetrics


class GenerationTelemetry:
    """Collects one request's timings into its spans and the frontend's histograms."""

    def __init__(
        self, tracer: trace.Tracer, metrics: FrontendMetrics | None, model: str, stream: bool
    ) -> None:
        self._tracer = tracer
        self._metrics = metrics
        self._span = trace.get_current_span()
        self._model = model
        self._stream = stream
        self._received = time.perf_counter()
        self._last_token: float | None = None
        self._detok_start_ns: int | None = None
        self._detok_busy_s = 0.0

    def tokenize_span(self) -> trace.Span:
        """A context manager span around tokenization and validation."""
        return self._tracer.start_as_current_span("tokenize", kind=SpanKind.INTERNAL)

    def validated(self, request: EngineRequest) -> None:
        """Sets the GenAI request attributes on the server span."""
        s = request.sampling
        attributes = {
            GEN_AI_OPERATION_NAME: "text_completion",
            GEN_AI_PROVIDER_NAME: "zerolayer",
            GEN_AI_REQUEST_MODEL: self._model,
            GEN_AI_REQUEST_MAX_TOKENS: request.max_new_tokens,
            GEN_AI_REQUEST_TEMPERATURE: s.temperature,
            GEN_AI_REQUEST_TOP_P: s.top_p,
            GEN_AI_REQUEST_STREAM: self._stream,
            GEN_AI_RESPONSE_ID: request.request_id,
            GEN_AI_USAGE_INPUT_TOKENS: len(request.prompt_token_ids),
        }
        if s.top_k:
            attributes[GEN_AI_REQUEST_TOP_K] = s.top_k
        if s.seed is not None:
            attributes[GEN_AI_REQUEST_SEED] = s.seed
        self._span.set_attributes(attributes)

    def detokenized(self, busy_s: float) -> None:
        """One piece was detokenized, taking ``busy_s`` seconds."""
        if self._detok_start_ns is None:
            self._detok_start_ns = now_ns()
        self._detok_busy_s += busy_s

    def sent(self, chunk: GenerationChunk) -> None:
        """``chunk`` is about to be sent: in a response of its own if the call streams, else
        joined with the others into the one response sent after the last chunk.

        The latencies are those the client sees: a streamed call's TTFT at its first
        token-carrying response and an inter-token gap between each two of them; a unary call's
        TTFT at its one response (its end-to-end latency) and no gaps.
        """
        now = time.perf_counter()
        last = chunk.finish_reason != FinishReason.UNSPECIFIED and chunk.usage is not None
        if self._metrics is not None and chunk.token_ids and self._stream:
            if self._last_token is None:
                self._metrics.ttft.observe(now - self._received)
            else:
                self._metrics.itl.observe(now - self._last_token)
        if chunk.token_ids:
            self._last_token = now
        if not last:
            return
        if self._metrics is not None:
            if not self._stream and self._last_token is not None:
                self._metrics.ttft.observe(now - self._received)
            self._metrics.e2e.observe(now - self._received)
        self._span.set_attributes(
            {
                GEN_AI_RESPONSE_FINISH_REASONS: [chunk.finish_reason.name.lower()],
                GEN_AI_USAGE_INPUT_TOKENS: chunk.usage.prompt_tokens,
                GEN_AI_USAGE_OUTPUT_TOKENS: chunk.usage.completion_tokens,
                GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: chunk.usage.cached_prompt_tokens,
                GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: chunk.usage.cache_write_prompt_tokens,
                "zerolayer.pinned_prompt_tokens": chunk.usage.pinned_prompt_tokens,
                "zerolayer.pin_refusal": chunk.usage.pin_refusal,
            }
        )
        if self._detok_start_ns is not None:
            self._tracer.start_span(
                "detokenize",
                kind=SpanKind.INTERNAL,
                start_time=self._detok_start_ns,
                attributes={
                    "zerolayer.detokenize_busy_ms": self._detok_busy_s * 1e3,
                    GEN_AI_USAGE_OUTPUT_TOKENS: chunk.usage.completion_tokens,
                },
            ).end(end_time=now_ns())
