"""OpenAI request bodies to GenerateParams (zerolayer.frontend.openai.params)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    CachePin,
    ChatMessage,
    GenerateParams,
    StructuredOutput,
    ToolCall,
)
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
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"moderation": {"mode": "block"}}, "moderation"),
        ({"messages": [{"role": "assistant", "audio": {"id": "a"}}]}, "messages[0].audio"),
        (
            {"messages": [{"role": "assistant", "function_call": {"name": "f", "arguments": ""}}]},
            "messages[0].function_call",
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


OPENAI_ECHO = {
    "content": "Hi!",
    "refusal": None,
    "role": "assistant",
    "annotations": None,
    "audio": None,
    "function_call": None,
    "tool_calls": None,
}
"""``resp.choices[0].message.model_dump()`` of the official client (openai 3.57)."""


def test_the_official_clients_echo_of_its_answer_is_an_assistant_message() -> None:
    messages = [{"role": "user", "content": "hi"}, OPENAI_ECHO, {"role": "user", "content": "?"}]
    assert chat(messages=messages).messages[1] == ChatMessage("assistant", "Hi!")
    refused = {**OPENAI_ECHO, "content": None, "refusal": "No."}
    assert chat(messages=[refused]).messages[0] == ChatMessage("assistant", "No.")
    parts = [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}]
    assert chat(messages=[{"role": "assistant", "content": parts}]).messages[0].content == "ab"


def test_null_is_each_fields_default() -> None:
    nullable = ["n", "stream", "logprobs", "top_logprobs", "stop", "seed", "temperature",
                "top_p", "logit_bias", "max_tokens", "max_completion_tokens", "stream_options",
                "response_format", "store", "metadata", "service_tier", "modalities",
                "presence_penalty", "frequency_penalty", "user"]  # fmt: skip
    assert chat(**dict.fromkeys(nullable)) == chat()
    assert completion(**dict.fromkeys(["n", "echo", "best_of", "suffix", "logprobs"])) == (
        completion()
    )
    with pytest.raises(ValidationError):  # null is no message role
        chat(messages=[{"role": None, "content": "x"}])


def test_metadata_only_fields_change_nothing() -> None:
    tagged = chat(
        metadata={"k": "v"},
        store=True,
        service_tier="flex",
        safety_identifier="s",
        prompt_cache_key="p",
        prompt_cache_retention="in_memory",
        prompt_cache_options={"mode": "explicit"},
        modalities=["text"],
        verbosity="high",
        prediction={"type": "content", "content": "x"},
        stream_options={"include_obfuscation": False},
    )
    assert tagged == chat()


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


@pytest.mark.parametrize("make", [chat, completion])
def test_prompt_cache_fields_pin_the_prompt_for_the_longer_ttl(make) -> None:
    assert make(prompt_cache_retention="24h", prompt_cache_key="s1").cache_pins == (
        CachePin(86400, key="s1"),
    )
    assert make(prompt_cache_options={"ttl": "30m"}).cache_pins == (CachePin(1800),)
    assert make(prompt_cache_options={}, prompt_cache_retention="24h").cache_pins == (
        CachePin(86400),
    )
    assert make(prompt_cache_retention="in_memory", prompt_cache_key="s1").cache_pins == ()
    assert make(prompt_cache_options={"mode": "explicit"}).cache_pins == ()
    assert make(prompt_cache_options={"ttl": None, "mode": None}).cache_pins == (CachePin(1800),)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"ttl": "5m"}, "prompt_cache_options.ttl"),
        ({"mode": "sometimes"}, "prompt_cache_options.mode"),
        ({"size": 1}, "prompt_cache_options.size"),
    ],
)
def test_prompt_cache_options_openai_does_not_define_are_refused_by_name(options, field) -> None:
    with pytest.raises(InvalidArgument) as raised:
        chat(prompt_cache_options=options)
    assert raised.value.field == field


@pytest.mark.parametrize("make", [chat, completion])
def test_a_prompt_cache_key_over_256_bytes_is_refused_by_its_name_pinned_or_not(make) -> None:
    for retention in ("24h", None):
        with pytest.raises(InvalidArgument) as raised:
            make(prompt_cache_key="日" * 86, prompt_cache_retention=retention)  # 258 bytes
        assert raised.value.field == "prompt_cache_key"
