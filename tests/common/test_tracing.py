"""Span attributes reach OTLP whole: values OTLP cannot hold (an int outside int64, such as a
uint64 seed) are exported as their decimal string, not dropped with a logged traceback."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from zerolayer.common.tracing import (
    GEN_AI_REQUEST_SEED,
    Tracing,
    TracingConfig,
    otlp_safe_value,
)

MAX_SEED = 2**64 - 1
"""The largest seed the API allows (uint64)."""


def export_one_span(attributes: dict[str, object]) -> ReadableSpan:
    """The span that a real tracing pipeline hands to its exporter, with ``attributes`` set on
    the span, on one event and on nothing else."""
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingConfig("otlp", "test"), exporter=exporter)
    with tracing.tracer.start_as_current_span("generate") as span:
        span.set_attributes(attributes)
        span.add_event("gpu event", attributes)
    tracing.shutdown()
    (exported,) = exporter.get_finished_spans()
    return exported


def otlp_attributes(key_values) -> dict[str, object]:
    """OTLP ``KeyValue`` messages as {key: the one value field set}."""
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in key_values}


def test_a_uint64_seed_is_exported_as_its_decimal_string_by_the_otlp_encoder(
    caplog: pytest.LogCaptureFixture,
) -> None:
    span = export_one_span({GEN_AI_REQUEST_SEED: MAX_SEED, "zerolayer.prompt_tokens": 7})

    with caplog.at_level(logging.DEBUG):
        request = encode_spans([span])

    (pb_span,) = request.resource_spans[0].scope_spans[0].spans
    expected = {GEN_AI_REQUEST_SEED: "18446744073709551615", "zerolayer.prompt_tokens": 7}
    assert otlp_attributes(pb_span.attributes) == expected
    assert otlp_attributes(pb_span.events[0].attributes) == expected
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_span_whose_attributes_all_fit_is_exported_as_it_is() -> None:
    span = export_one_span({GEN_AI_REQUEST_SEED: 2**63 - 1, "zerolayer.prompt_tokens": 7})

    assert dict(span.attributes) == {GEN_AI_REQUEST_SEED: 2**63 - 1, "zerolayer.prompt_tokens": 7}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2**63 - 1, 2**63 - 1),
        (-(2**63), -(2**63)),
        (2**63, "9223372036854775808"),
        (-(2**63) - 1, "-9223372036854775809"),
        (True, True),
        (0.5, 0.5),
        ("text", "text"),
        ((1, 2), (1, 2)),
        ((1, 2**64), ("1", "18446744073709551616")),
        (("a", "b"), ("a", "b")),
    ],
)
def test_otlp_safe_value_turns_only_ints_outside_int64_into_strings(
    value: object, expected: object
) -> None:
    assert otlp_safe_value(value) == expected
