"""The bounds of a structured-output constraint where the request enters: size, the nesting of a
JSON schema, llguidance's own limits, and messages that never quote a whole grammar."""

from __future__ import annotations

import json

import pytest

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import StructuredOutput
from zerolayer.common.structured_output import (
    MAX_ERROR_CHARS,
    MAX_SCHEMA_DEPTH,
    bounded,
    check_size,
    grammar_of,
    json_depth,
)


def nested_schema(levels: int) -> str:
    """An object schema whose property ``a`` is one, ``levels`` times (2 JSON levels each), as
    text built without recursion."""
    head = '{"type": "object", "properties": {"a": ' * levels
    return head + '{"type": "integer"}' + "}}" * levels


def refused(constraint: StructuredOutput) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        grammar_of(constraint)
    return info.value


def test_a_constraint_over_the_size_limit_is_refused_by_its_field_before_it_is_read() -> None:
    constraint = StructuredOutput("grammar", "x" * 1001)
    check_size(constraint, 1001)
    with pytest.raises(InvalidArgument) as info:
        check_size(constraint, 1000)
    assert str(info.value) == (
        "structured_output.grammar: 1001 bytes; at most 1000 (--max-grammar-bytes)"
    )


def test_the_size_counts_utf8_bytes() -> None:
    with pytest.raises(InvalidArgument):
        check_size(StructuredOutput("regex", "é" * 501), 1001)


def test_a_schema_at_the_depth_limit_compiles_and_one_level_deeper_is_refused() -> None:
    inner = nested_schema(MAX_SCHEMA_DEPTH // 2 - 1)
    at_limit = '{"type": "array", "items": ' + inner + "}"
    assert json_depth(json.loads(at_limit)) == MAX_SCHEMA_DEPTH
    grammar_of(StructuredOutput("json_schema", at_limit))
    deeper = '{"type": "array", "items": ' + at_limit + "}"
    error = refused(StructuredOutput("json_schema", deeper))
    assert str(error) == (
        "structured_output.json_schema: nested more than 64 levels of objects and arrays"
    )


def test_a_schema_thousands_of_levels_deep_is_refused_not_a_recursion_error() -> None:
    error = refused(StructuredOutput("json_schema", nested_schema(5000)))
    assert error.field == "structured_output.json_schema"
    assert "nested more than" in str(error)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"next": {"$ref": "#"}}},
        {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"},
    ],
)
def test_a_self_referencing_schema_that_can_end_compiles(schema: dict) -> None:
    grammar_of(StructuredOutput("json_schema", json.dumps(schema)))


def test_a_lark_grammar_nested_too_deeply_is_refused_without_its_text() -> None:
    grammar = "start: " + "(" * 5000 + '"a"' + ")" * 5000
    error = refused(StructuredOutput("grammar", grammar))
    assert error.field == "structured_output.grammar"
    assert "too deeply nested" in str(error)
    assert len(str(error)) <= len("structured_output.grammar: ") + MAX_ERROR_CHARS


def test_an_invalid_regex_says_why_in_one_line() -> None:
    error = refused(StructuredOutput("regex", "[0-9]{3"))
    assert "\n" not in str(error)
    assert "unclosed counted repetition" in str(error)


def test_an_error_quoting_a_long_grammar_line_is_cut() -> None:
    grammar = 'start: "a" | b\nb: "x" "' + "y" * 100_000  # an unterminated string
    error = refused(StructuredOutput("grammar", grammar))
    assert len(str(error)) <= len("structured_output.grammar: ") + MAX_ERROR_CHARS
    assert "y" * 200 not in str(error)


def test_bounded_drops_quoted_source_lines_and_markers() -> None:
    message = 'at 1(8): unknown name: "r"\n   1 | start: r\n              ^\n'
    assert bounded(message) == 'at 1(8): unknown name: "r"'
    assert bounded("z" * 10_000) == "z" * 117 + "..."
    assert len(bounded("\n".join(["z" * 100] * 10))) == MAX_ERROR_CHARS
