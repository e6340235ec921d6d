"""The grammar of a required or named tool call: the output is then valid calls of the model's
format, with arguments valid against each tool's JSON schema.

A Lark grammar in llguidance's dialect (https://github.com/guidance-ai/llguidance/blob/main/docs/
syntax.md) whose calls are ``%json`` rules, one schema per tool: an object of the tool's
``name`` (a constant) and its arguments (the tool's schema, its ``$defs`` moved to the root so
that its references still hold), compact as the structured-output machinery writes JSON
(``zerolayer.common.structured_output``). It goes to the scheduler as a StructuredOutput of kind
"grammar", through the same validation and matcher as any grammar.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from zerolayer.common.generation import ToolDefinition
from zerolayer.frontend.chat.tool_formats import ToolFormat

_DEFINITIONS = ("$defs", "definitions")


def call_schema(tool: ToolDefinition, arguments_key: str) -> dict:
    """The JSON schema of one call of ``tool``: ``{"name": <its name>, <arguments_key>: <its
    arguments>}``, in that order, nothing else.

    Raises:
        ValueError: ``tool.parameters_json`` is not a JSON object (checked before: tool_request).
    """
    parameters = json.loads(tool.parameters_json)
    hoisted = {key: parameters.pop(key) for key in _DEFINITIONS if key in parameters}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False},
        **hoisted,
    }


def tool_call_grammar(fmt: ToolFormat, tools: Sequence[ToolDefinition], parallel: bool) -> str:
    """The Lark grammar of one call of any of ``tools`` (several with ``parallel``) in ``fmt``.

    Args:
        tools: at least one.
    """
    rules = [
        f"call_{i}: %json {json.dumps(call_schema(t, fmt.arguments_key))}"
        for i, t in enumerate(tools)
    ]
    alternatives = " | ".join(f"call_{i}" for i in range(len(tools)))
    call = f"{_literal(fmt.call_open)} ({alternatives}) {_literal(fmt.call_close)}"
    more = f"({_literal(fmt.grammar_between)} call)*" if parallel else ""
    start = f"start: {_literal(fmt.grammar_open)} call {more} {_literal(fmt.grammar_close)}"
    return "\n".join([start, f"call: {call}", *rules]) + "\n"


def _literal(text: str) -> str:
    """A Lark string literal of ``text`` ("" for none)."""
    return json.dumps(text) if text else ""
