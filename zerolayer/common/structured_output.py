"""A structured-output constraint as an llguidance grammar, and its validation.

The frontend validates a request's constraint with :func:`check_size` and :func:`grammar_of`
(INVALID_ARGUMENT naming the field); the scheduler builds its per-request matcher from the same
grammar, under the same :func:`parser_limits` (:mod:`zerolayer.scheduler.model.structured_output`).
The library is Guidance's llguidance (https://github.com/guidance-ai/llguidance; why it over
xgrammar: docs/benchmarks.md).

Bounds (docs/structured-output.md, "Limits"): the text's size (``--max-grammar-bytes``), the
nesting depth of a JSON schema (:data:`MAX_SCHEMA_DEPTH`), llguidance's own parser limits with
its verbose errors off (they quote the whole grammar and the parser's state), and every message
cut to :data:`MAX_ERROR_CHARS`.

JSON is compact: no whitespace between tokens (llguidance's ``whitespace_flexible`` off), items
separated by ``,`` and keys by ``:``. NOTE: with flexible whitespace a small model can emit
whitespace until max_new_tokens and never close the object.
"""

from __future__ import annotations

import json
import re

from llguidance import LLMatcher, LLParserLimits

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import StructuredOutput

KINDS = ("json_schema", "json_object", "regex", "grammar")
"""The constraint kinds (the fields of the StructuredOutput oneof)."""

MAX_SCHEMA_DEPTH = 64
"""Deepest nesting of objects and arrays in a JSON schema's text (a property of an object
schema is two levels: ``properties``, then its schema). llguidance's JSON parser stops at 128,
Python's at about 1,000; a tool's parameters rarely pass 10."""
MAX_ERROR_CHARS = 300
"""Longest error message of a refused constraint, characters (llguidance's can quote the whole
grammar; the message travels in a gRPC trailer and a log line)."""
MAX_ERROR_LINE_CHARS = 120
"""Longest line kept of an llguidance error message, characters (one can quote a long regex)."""
_SOURCE_LINE = re.compile(r"\d+ \| ")
"""A source line quoted in an llguidance error (``  1 | start: ...``, stripped)."""

_JSON_OPTIONS = {"whitespace_flexible": False}


def parser_limits() -> LLParserLimits:
    """llguidance's limits for every matcher and validation here: its defaults (grammar size,
    lexer fuel and states, items per row and step), with ``verbose_errors`` off so that an error
    names the problem without the grammar's text and the parser's state."""
    return LLParserLimits(verbose_errors=False)


def check_size(constraint: StructuredOutput, max_bytes: int) -> None:
    """Refuses a constraint whose text is over ``max_bytes`` bytes (UTF-8), before anything reads
    it.

    Raises:
        InvalidArgument: naming ``structured_output.<kind>``, its size and the limit.
    """
    size = len(constraint.value.encode())
    if size > max_bytes:
        raise InvalidArgument(
            f"structured_output.{constraint.kind}",
            f"{size} bytes; at most {max_bytes} (--max-grammar-bytes)",
        )


def grammar_of(constraint: StructuredOutput) -> str:
    """The llguidance grammar (its JSON text) of ``constraint``, validated under
    :func:`parser_limits` (without the tokenizer: what only a tokenizer can tell, e.g. a grammar
    that matches nothing, the scheduler's matcher reports).

    Args:
        constraint: kind "json_schema" (value: the schema as JSON text), "json_object" (any JSON
            object), "regex" (Rust regex syntax, the whole output matches) or "grammar" (Lark,
            llguidance's dialect: https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md).

    Returns:
        The grammar, for ``llguidance.LLMatcher(tokenizer, grammar, limits=parser_limits())``.

    Raises:
        InvalidArgument: an unknown kind; a schema that is not JSON, nested deeper than
            :data:`MAX_SCHEMA_DEPTH` or refused by llguidance; a regex or grammar llguidance
            rejects. The field is ``structured_output.<kind>``, the message at most
            :data:`MAX_ERROR_CHARS` characters.
    """
    field = f"structured_output.{constraint.kind}"
    if constraint.kind == "json_schema":
        grammar = _json_schema_grammar(field, constraint.value)
    elif constraint.kind == "json_object":
        grammar = LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
    elif constraint.kind == "regex":
        grammar = LLMatcher.grammar_from_regex(constraint.value)
    elif constraint.kind == "grammar":
        grammar = LLMatcher.grammar_from_lark(constraint.value)
    else:
        raise InvalidArgument("structured_output", f"unknown kind {bounded(constraint.kind)!r}")
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, limits=parser_limits())
    if is_error:
        raise InvalidArgument(field, bounded(messages[0]))
    return grammar


def _json_schema_grammar(field: str, text: str) -> str:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(field, f"not JSON: {exc}") from None
    except RecursionError:
        schema = None  # deeper than Python's parser goes: refused below
    depth = json_depth(schema) if schema is not None else MAX_SCHEMA_DEPTH + 1
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidArgument(
            field, f"nested more than {MAX_SCHEMA_DEPTH} levels of objects and arrays"
        )
    if not isinstance(schema, dict | bool):
        raise InvalidArgument(field, "a JSON schema is an object or a boolean")
    try:
        return LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    except ValueError as exc:
        raise InvalidArgument(field, bounded(str(exc))) from None


def json_depth(value: object) -> int:
    """How deeply objects and arrays nest in a parsed JSON value (a scalar: 0, ``{}``: 1),
    counted without recursion."""
    depth = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, dict | list):
            depth = max(depth, level)
            stack.extend((child, level + 1) for child in children)
    return depth


def bounded(message: str) -> str:
    """``message`` in one line of at most :data:`MAX_ERROR_CHARS` characters: llguidance's
    errors quote the grammar's source lines (``  12 | ...``, then a ``^`` marker) after what
    went wrong, and a quoted line can be the whole grammar; those are dropped, every other line
    is cut to :data:`MAX_ERROR_LINE_CHARS`."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [
        _cut(line, MAX_ERROR_LINE_CHARS)
        for line in lines
        if line and not _SOURCE_LINE.match(line) and set(line) != {"^"}
    ]
    return _cut(" ".join(kept), MAX_ERROR_CHARS)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
