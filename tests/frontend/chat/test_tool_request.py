"""A request's tools checked, and the constraint and parsing plan they give."""

from __future__ import annotations

import json

import pytest
from llguidance import LLMatcher, LLTokenizer

from zerolayer.checkpoints.byte_tokenizer import build_byte_level_tokenizer
from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    ChatMessage,
    GenerateParams,
    StructuredOutput,
    ToolChoice,
    ToolDefinition,
)
from zerolayer.frontend.chat.tool_formats import FORMATS
from zerolayer.frontend.chat.tool_grammar import tool_call_grammar
from zerolayer.frontend.chat.tool_request import plan_output

HERMES_TEMPLATE = "{{ '<tool_call>' }}{{ '<think></think>' }}"
TOOL = ToolDefinition(
    "get_time",
    parameters_json=json.dumps(
        {"type": "object", "properties": {"tz": {"enum": ["UTC"]}}, "required": ["tz"]}
    ),
)
OTHER = ToolDefinition("other")


def params(**fields: object) -> GenerateParams:
    return GenerateParams(messages=(ChatMessage("user", "hi"),), parse_output=True, **fields)


def test_auto_parses_the_templates_format_without_a_constraint() -> None:
    request, plan = plan_output(params(tools=(TOOL,)), HERMES_TEMPLATE, "auto")
    assert request.structured_output is None
    assert (plan.tool_format, plan.max_calls, plan.thinks) == (FORMATS["hermes"], None, True)


def test_none_parses_no_call_and_needs_no_format() -> None:
    choice = ToolChoice("none")
    request, plan = plan_output(params(tools=(TOOL,), tool_choice=choice), "{{ x }}", "auto")
    assert request.structured_output is None and plan.tool_format is None


@pytest.mark.parametrize(
    ("choice", "parallel", "tools", "max_calls"),
    [
        (ToolChoice("required"), True, [TOOL, OTHER], None),
        (ToolChoice("required"), False, [TOOL, OTHER], 1),
        (ToolChoice("function", "get_time"), True, [TOOL], 1),
    ],
)
def test_required_and_named_constrain_to_the_formats_calls(choice, parallel, tools, max_calls):
    request, plan = plan_output(
        params(tools=(TOOL, OTHER), tool_choice=choice, parallel_tool_calls=parallel),
        HERMES_TEMPLATE,
        "auto",
    )
    grammar = tool_call_grammar(FORMATS["hermes"], tools, parallel=max_calls is None)
    assert request.structured_output == StructuredOutput("grammar", grammar)
    assert (plan.max_calls, plan.thinks) == (max_calls, False)


@pytest.mark.parametrize(
    ("fmt", "call"),
    [
        ("hermes", '<tool_call>\n{"name":"get_time","arguments":{"tz":"UTC"}}\n</tool_call>'),
        ("llama3_json", '{"name":"get_time","parameters":{"tz":"UTC"}}'),
        ("mistral", '[TOOL_CALLS][{"name":"get_time","arguments":{"tz":"UTC"}}]'),
    ],
)
def test_a_call_grammar_accepts_the_formats_call_and_nothing_else(fmt, call) -> None:
    grammar = tool_call_grammar(FORMATS[fmt], [TOOL, OTHER], parallel=False)
    assert _accepts(grammar, call)
    assert not _accepts(grammar, call.replace("UTC", "CET"))  # not the schema's
    assert not _accepts(grammar, call.replace("get_time", "get_tim"))  # no such tool
    assert not _accepts(grammar, call + call)  # one call only


def _accepts(lark: str, text: str) -> bool:
    """Whether ``text`` is a whole sentence of ``lark``, by llguidance's matcher over the dummy
    model's byte-level tokenizer."""
    tokenizer = LLTokenizer(build_byte_level_tokenizer().to_str(), n_vocab=259, eos_token=[2])
    matcher = LLMatcher(tokenizer, LLMatcher.grammar_from_lark(lark))
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"tools": (ToolDefinition("bad name"),)}, "tools[0].name"),
        ({"tools": (TOOL, TOOL)}, "tools[1].name"),
        ({"tools": (ToolDefinition("f", parameters_json="[1]"),)}, "tools[0].parameters_json"),
        (
            {"tools": (ToolDefinition("f", parameters_json='{"type": "nonsense"}'),)},
            "tools[0].parameters_json",
        ),
        ({"tools": (TOOL,), "tool_choice": ToolChoice("any")}, "tool_choice"),
        ({"tools": (TOOL,), "tool_choice": ToolChoice("function", "nope")}, "tool_choice"),
        ({"tool_choice": ToolChoice("required")}, "tool_choice"),
        (
            {
                "tools": (TOOL,),
                "tool_choice": ToolChoice("required"),
                "structured_output": StructuredOutput("json_object"),
            },
            "tool_choice",
        ),
    ],
)
def test_bad_tools_are_refused_naming_the_field(fields, field) -> None:
    with pytest.raises(InvalidArgument) as refused:
        plan_output(params(**fields), HERMES_TEMPLATE, "auto")
    assert refused.value.field == field


def test_tools_on_a_template_without_a_call_format_are_refused() -> None:
    with pytest.raises(InvalidArgument) as refused:
        plan_output(params(tools=(TOOL,)), "{{ messages }}", "auto")
    assert refused.value.field == "tools"
    assert plan_output(params(tools=(TOOL,)), "{{ messages }}", "hermes")[1] is not None
    with pytest.raises(InvalidArgument):
        plan_output(params(tools=(TOOL,)), HERMES_TEMPLATE, "none")


def test_tools_need_messages() -> None:
    with pytest.raises(InvalidArgument) as refused:
        plan_output(GenerateParams(prompt="hi", tools=(TOOL,)), HERMES_TEMPLATE, "auto")
    assert refused.value.field == "tools"
    assert plan_output(GenerateParams(prompt="hi"), HERMES_TEMPLATE, "auto")[1] is None
