"""A chat request's tools checked, and what they mean for its generation: the constraint of a
required or named call, and how the output is parsed.

``tool_choice`` (OpenAI's semantics, https://platform.openai.com/docs/guides/function-calling):
"auto" (the default with tools) lets the model answer or call, and parses what it wrote (plain text
when it wrote no call); "none" (the default without tools) parses no call (the tools are still
rendered by the template, which is all they do then); "required" and a named function constrain
decoding to the format's calls (:mod:`zerolayer.frontend.chat.tool_grammar`), at least one call of
any tool, or one of the named one. ``parallel_tool_calls`` false keeps one call.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    TOOL_CHOICE_MODES,
    GenerateParams,
    StructuredOutput,
    ToolChoice,
)
from zerolayer.common.structured_output import grammar_of
from zerolayer.frontend.chat.output_parser import OutputPlan
from zerolayer.frontend.chat.reasoning import template_thinks
from zerolayer.frontend.chat.tool_formats import tool_format
from zerolayer.frontend.chat.tool_grammar import tool_call_grammar

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A function's name as OpenAI allows it."""
MAX_TOOLS = 128
"""Most tools a request may give (OpenAI's limit)."""


def plan_output(
    params: GenerateParams, template_source: str | None, parser_flag: str
) -> tuple[GenerateParams, OutputPlan | None]:
    """The request to generate (with the constraint of a required or named call) and how its
    output is parsed (None: it is not).

    Args:
        template_source: the model's chat template (None: it has none).
        parser_flag: ``--tool-call-parser``.

    Raises:
        InvalidArgument: ``tools`` without messages, too many, a name OpenAI does not allow or
            given twice, or a model whose template has no tool-call format;
            ``tools[i].parameters_json`` not a JSON schema llguidance compiles; ``tool_choice``
            unknown, naming no tool, needing tools, or beside ``structured_output``.
    """
    if not params.parse_output and not params.tools and params.tool_choice is None:
        return params, None
    if params.messages is None:
        field = "tools" if params.tools or params.tool_choice is None else "tool_choice"
        raise InvalidArgument(field, "chat only (send messages)")
    _check_tools(params)
    choice = params.tool_choice or ToolChoice("auto" if params.tools else "none")
    _check_choice(choice, params)
    source = template_source or ""
    fmt = tool_format(parser_flag, source) if choice.mode != "none" and params.tools else None
    if fmt is None and choice.mode != "none" and params.tools:
        raise InvalidArgument(
            "tools",
            "the model's chat template writes no tool-call format zerolayer parses (hermes, "
            f"llama3_json, mistral; --tool-call-parser is {parser_flag!r})",
        )
    one = not params.parallel_tool_calls or choice.mode == "function"
    constrained = fmt is not None and choice.mode in ("required", "function")
    if constrained:
        tools = [t for t in params.tools if choice.mode == "required" or t.name == choice.name]
        grammar = tool_call_grammar(fmt, tools, parallel=not one)
        params = replace(params, structured_output=StructuredOutput("grammar", grammar))
    # NOTE: a constrained output is the calls alone, even after a prompt that opened a thought.
    plan = OutputPlan(fmt, 1 if one else None, template_thinks(source) and not constrained)
    return params, plan


def _check_tools(params: GenerateParams) -> None:
    if len(params.tools) > MAX_TOOLS:
        raise InvalidArgument("tools", f"{len(params.tools)} tools; at most {MAX_TOOLS}")
    seen: set[str] = set()
    for i, tool in enumerate(params.tools):
        if not TOOL_NAME.fullmatch(tool.name):
            raise InvalidArgument(
                f"tools[{i}].name",
                f"must be 1 to 64 of a-z, A-Z, 0-9, _ and -, got {tool.name!r:.80}",
            )
        if tool.name in seen:
            raise InvalidArgument(f"tools[{i}].name", f"{tool.name!r} is given twice")
        seen.add(tool.name)
        field = f"tools[{i}].parameters_json"
        try:
            schema = json.loads(tool.parameters_json)
        except (json.JSONDecodeError, RecursionError):
            raise InvalidArgument(field, "not JSON") from None
        if not isinstance(schema, dict):
            raise InvalidArgument(field, "a JSON schema of the arguments is an object")
        try:
            grammar_of(StructuredOutput("json_schema", tool.parameters_json))
        except InvalidArgument as exc:
            raise InvalidArgument(field, str(exc).split(": ", 1)[-1]) from None


def _check_choice(choice: ToolChoice, params: GenerateParams) -> None:
    if choice.mode not in TOOL_CHOICE_MODES:
        raise InvalidArgument(
            "tool_choice", f"must be one of {', '.join(TOOL_CHOICE_MODES)}, got {choice.mode!r:.64}"
        )
    if choice.mode in ("required", "function") and not params.tools:
        raise InvalidArgument("tool_choice", f"{choice.mode!r} needs tools")
    if choice.mode == "function" and choice.name not in {t.name for t in params.tools}:
        raise InvalidArgument("tool_choice", f"names {choice.name!r:.80}, which is not in tools")
    if choice.mode in ("required", "function") and params.structured_output is not None:
        raise InvalidArgument(
            "tool_choice",
            f"{choice.mode!r} constrains the output: it cannot be combined with "
            "structured_output (response_format)",
        )
