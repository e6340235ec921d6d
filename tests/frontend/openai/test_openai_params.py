"""OpenAI request bodies to GenerateParams (zerolayer.frontend.openai.params)."""

from __future__ import annotations

import json

import pytest

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import ChatMessage, GenerateParams, StructuredOutput, ToolCall
from zerolayer.frontend.openai.params import chat_params, completion_params, openai_param
from zerolayer.frontend.openai.schema import ChatCompletionRequest, CompletionRequest


def completion(**body: object) -> GenerateParams:
    return completion_params(CompletionRequest.model_validate({"prompt": "hi", **body}), "r1")


def chat(**body: object) -> GenerateParams:
    messages = body.pop("messages", [{"role": "user", "content": "hi"}])
    request = ChatCompletionRequest.model_validate({"messages": messages, **body})
    return chat_params(request, "r1")


def test_every_completion_field_maps_onto_generate_params() -> None:
    schema = {"type": "object"}
    params = completion(
        model="m",
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        n=3,
        stop="END",
        presence_penalty=0.1,
        frequency_penalty=0.2,
        logit_bias={"12": -100, "3": 5},
        seed=-1,
        logprobs=2,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        top_k=4,
        min_p=0.05,
        repetition_penalty=1.1,
        min_tokens=2,
        stop_token_ids=[9, 8],
        ignore_eos=True,
        cache_salt="s",
        prompt_logprobs=1,
        user="ignored",
    )
    assert params == GenerateParams(
        prompt="hi",
        max_new_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=4,
        seed=2**64 - 1,
        stop=("END",),
        ignore_eos=True,
        cache_salt="s",
        request_id="r1",
        model="m",
        repetition_penalty=1.1,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        min_p=0.05,
        min_new_tokens=2,
        stop_token_ids=(9, 8),
        logit_bias=((3, 5.0), (12, -100.0)),
        logprobs=2,
        prompt_logprobs=1,
        n=3,
        structured_output=StructuredOutput("json_schema", json.dumps(schema)),
    )


def test_defaults_are_openais() -> None:
    params = completion()
    assert (params.temperature, params.max_new_tokens, params.n, params.logprobs) == (
        1.0,
        0,
        1,
        None,
    )


@pytest.mark.parametrize(
    ("prompt", "text", "ids"),
    [("a", "a", None), ([1, 2], None, (1, 2)), (["a"], "a", None), ([[1, 2]], None, (1, 2))],
)
def test_one_prompt_as_text_or_ids(prompt, text, ids) -> None:
    params = completion(prompt=prompt)
    assert (params.prompt, params.prompt_token_ids) == (text, ids)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"echo": True}, "echo"),
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"logit_bias": {"x1": 1}}, "logit_bias"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
    ],
)
def test_what_completions_do_not_implement_is_refused_naming_the_field(body, field) -> None:
    with pytest.raises(InvalidArgument) as refused:
        completion(**body)
    assert refused.value.field == field


def test_chat_messages_logprobs_and_max_completion_tokens() -> None:
    params = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "content": "42", "tool_call_id": "t1"},
        ],
        max_tokens=3,
        max_completion_tokens=5,
        logprobs=True,
        top_logprobs=4,
        response_format={"type": "json_object"},
        add_generation_prompt=False,
    )
    assert params.messages == (
        ChatMessage("system", "be brief"),
        ChatMessage("user", "ab"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("t1", "f", "{}"),)),
        ChatMessage("tool", "42", tool_call_id="t1"),
    )
    assert (params.prompt, params.max_new_tokens, params.logprobs) == (None, 5, 4)
    assert params.structured_output == StructuredOutput("json_object")
    assert params.add_generation_prompt is False
    assert chat(logprobs=True).logprobs == 0
    assert chat().logprobs is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "functions": [{"name": "g"}],
            },
            "functions",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "content": "42", "tool_call_id": "nope"},
                ]
            },
            "messages[1].tool_call_id",
        ),
    ],
)
def test_what_chat_does_not_implement_is_refused_naming_the_field(body, field) -> None:
    with pytest.raises(InvalidArgument) as refused:
        chat(**body)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("field", "chat_request", "param"),
    [
        ("max_new_tokens", False, "max_tokens"),
        ("prompt_token_ids", False, "prompt"),
        ("stop[2]", False, "stop"),
        ("logprobs", False, "logprobs"),
        ("logprobs", True, "top_logprobs"),
        ("prompt", True, "messages"),
        ("temperature", True, "temperature"),
        ("structured_output.json_schema", False, "response_format"),
        ("structured_output.json_schema", True, "response_format"),
        ("tools[2].parameters_json", True, "tools[2].function.parameters"),
        ("tools[0].name", True, "tools[0].function.name"),
    ],
)
def test_error_fields_are_named_as_openai_names_them(field, chat_request, param) -> None:
    assert openai_param(field, chat_request) == param


def test_tools_legacy_functions_and_template_variables_become_the_requests() -> None:
    from zerolayer.common.generation import ToolChoice, ToolDefinition

    tool = {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}
    params = chat(
        tools=[{"type": "function", "function": tool}],
        tool_choice={"type": "function", "function": {"name": "f"}},
        parallel_tool_calls=False,
        chat_template_kwargs={"enable_thinking": False},
        reasoning_effort="low",
    )
    assert params.tools == (ToolDefinition("f", "d", '{"type": "object", "properties": {}}'),)
    assert (params.tool_choice, params.parallel_tool_calls, params.parse_output) == (
        ToolChoice("function", "f"),
        False,
        True,
    )
    assert json.loads(params.chat_template_kwargs_json) == {
        "enable_thinking": False,
        "reasoning_effort": "low",
    }
    legacy = chat(functions=[{"name": "g"}], function_call={"name": "g"})
    assert legacy.tools == (ToolDefinition("g", "", '{"type": "object"}'),)
    assert legacy.tool_choice == ToolChoice("function", "g")
    assert chat(functions=[{"name": "g"}], function_call="none").tool_choice == ToolChoice("none")
    plain = chat()
    assert (plain.tools, plain.tool_choice, plain.chat_template_kwargs_json) == ((), None, "")
