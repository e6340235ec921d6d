"""A structured-output constraint as an llguidance grammar, and its validation.

The frontend validates a request's constraint with :func:`grammar_of` (INVALID_ARGUMENT naming the
field); the scheduler builds its per-request matcher from the same grammar
(:mod:`zerolayer.scheduler.model.structured_output`). The library is Guidance's llguidance
(https://github.com/guidance-ai/llguidance; why it over xgrammar: docs/benchmarks.md).

JSON is compact: no whitespace between tokens (llguidance's ``whitespace_flexible`` off), items
separated by ``,`` and keys by ``:``. NOTE: with flexible whitespace a small model can emit
whitespace until max_new_tokens and never close the object.
"""

from __future__ import annotations

import json

from llguidance import LLMatcher

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import StructuredOutput

KINDS = ("json_schema", "json_object", "regex", "grammar")
"""The constraint kinds (the fields of the StructuredOutput oneof)."""

_JSON_OPTIONS = {"whitespace_flexible": False}


def grammar_of(constraint: StructuredOutput) -> str:
    """The llguidance grammar (its JSON text) of ``constraint``, validated.

    Args:
        constraint: kind "json_schema" (value: the schema as JSON text), "json_object" (any JSON
            object), "regex" (Rust regex syntax, the whole output matches) or "grammar" (Lark,
            llguidance's dialect: https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md).

    Returns:
        The grammar, for ``llguidance.LLMatcher(tokenizer, grammar)``.

    Raises:
        InvalidArgument: an unknown kind, or a schema, regex or grammar llguidance rejects; the
            field is ``structured_output.<kind>`` and the message llguidance's.
    """
    field = f"structured_output.{constraint.kind}"
    if constraint.kind == "json_schema":
        try:
            schema = json.loads(constraint.value)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(field, f"not JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise InvalidArgument(field, "a JSON schema is an object or a boolean")
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    elif constraint.kind == "json_object":
        grammar = LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
    elif constraint.kind == "regex":
        grammar = LLMatcher.grammar_from_regex(constraint.value)
    elif constraint.kind == "grammar":
        grammar = LLMatcher.grammar_from_lark(constraint.value)
    else:
        raise InvalidArgument("structured_output", f"unknown kind {constraint.kind!r}")
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise InvalidArgument(field, messages[0].strip())
    return grammar
