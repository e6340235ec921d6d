"""Anthropic request bodies to the chat a template renders and to GenerateParams
(zerolayer.frontend.anthropic.params): system and content blocks, tool blocks into the seam's
shapes, ``tool_choice``, ``thinking``, the errors that name Anthropic's field, and the refusal of
tools until tool calling is merged."""

from __future__ import annotations

import json

import pytest

from zerolayer.common.errors import InvalidArgument

# NOTE: the seam's types (issue 30); after i30-tools merges: zerolayer.common.generation.
from zerolayer.common.generation import (
    CachePin,
    ChatMessage,
    GenerateParams,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)
from zerolayer.frontend.anthropic.params import (
    Conversation,
    conversation,
    count_params,
    generate_params,
    seam_fields,
)
from zerolayer.frontend.anthropic.schema import CountTokensRequest, MessagesRequest

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOL_LOOP = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two calls.", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "content": [{"type": "text", "text": "25"}, {"type": "text", "text": "C"}],
                "is_error": False,
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "And tomorrow?"},
        ],
    },
]


def chat(**body: object) -> Conversation:
    return conversation(CountTokensRequest.model_validate({"model": "m", **body}))


def messages_params(**body: object) -> GenerateParams:
    request = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    return generate_params(MessagesRequest.model_validate({**request, **body}), "rid")


def test_every_sampling_field_maps_onto_generate_params() -> None:
    params = messages_params(
        max_tokens=7,
        stop_sequences=["\n\n", "END"],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        metadata={"user_id": "u-1"},
        service_tier="auto",
    )
    assert params == GenerateParams(
        messages=(ChatMessage("user", "x"),),
        model="m",
        request_id="rid",
        max_new_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop=("\n\n", "END"),
        parse_output=True,  # the answer's thought and tool calls come back apart
    )


def test_the_default_temperature_is_anthropics() -> None:
    assert messages_params().temperature == 1.0
    assert messages_params(temperature=0).temperature == 0.0


def test_system_as_text_or_blocks_is_the_first_message() -> None:
    user = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    blocks = [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be kind."},
    ]
    assert chat(system="Be brief.", messages=user).messages == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "a\nb"),
    )
    assert chat(system=blocks, messages=user).messages[0] == ChatMessage(
        "system", "Be brief.\nBe kind."
    )


def test_a_tool_loop_becomes_tool_calls_and_tool_messages() -> None:
    tools = [
        {"name": "weather", "description": "Now.", "input_schema": WEATHER},
        {
            "name": "time",
            "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"},
        },
    ]
    got = chat(
        messages=TOOL_LOOP,
        tools=tools,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 2048},
    )
    assert got == Conversation(
        messages=(
            ChatMessage("user", "Weather in Paris and Rome?"),
            ChatMessage(
                "assistant",
                "Checking.",
                tool_calls=(
                    ToolCall("toolu_1", "weather", '{"city": "Paris"}'),
                    ToolCall("toolu_2", "weather", '{"city": "Rome"}'),
                ),
                reasoning_content="Two calls.",
            ),
            ChatMessage("tool", "18 C", "weather", "toolu_1"),
            ChatMessage("tool", "25\nC", "weather", "toolu_2"),
            ChatMessage("user", "And tomorrow?"),
        ),
        tools=(
            ToolDefinition("weather", "Now.", json.dumps(WEATHER)),
            ToolDefinition("time", "", '{"type": "object"}'),
        ),
        tool_choice=ToolChoice("auto"),
        parallel_tool_calls=False,
        enable_thinking=True,
        # the tool's breakpoint where the first message starts; the result's at its end
        cache_pins=(
            CachePin(300, message_index=0),
            CachePin(300, message_index=3, content_offset=4),
        ),
    )
    assert seam_fields(got) == {
        "tools": got.tools,
        "tool_choice": ToolChoice("auto"),
        "parallel_tool_calls": False,
        "chat_template_kwargs_json": '{"enable_thinking": true}',
        "parse_output": True,
    }


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, ToolChoice("auto")),
        ({"type": "any"}, ToolChoice("required")),
        ({"type": "tool", "name": "weather"}, ToolChoice("function", "weather")),
        ({"type": "none"}, ToolChoice("none")),
    ],
)
def test_tool_choice_maps_onto_the_seams(choice, expected) -> None:
    tools = [{"name": "weather", "input_schema": WEATHER}]
    got = chat(messages=[{"role": "user", "content": "x"}], tools=tools, tool_choice=choice)
    assert (got.tool_choice, got.parallel_tool_calls) == (expected, True)


def test_thinking_disabled_is_said_to_the_template_and_unset_is_not() -> None:
    message = [{"role": "user", "content": "x"}]
    disabled = chat(messages=message, thinking={"type": "disabled"})
    assert seam_fields(disabled)["chat_template_kwargs_json"] == '{"enable_thinking": false}'
    adaptive = chat(messages=message, thinking={"type": "adaptive", "display": "omitted"})
    assert seam_fields(adaptive)["chat_template_kwargs_json"] == '{"enable_thinking": true}'
    assert seam_fields(chat(messages=message))["chat_template_kwargs_json"] == ""


def test_tools_reach_the_generation_for_messages_and_count_tokens_alike() -> None:
    tools = [{"name": "weather", "input_schema": WEATHER}]
    params = messages_params(tools=tools, tool_choice={"type": "tool", "name": "weather"})
    assert params.tools == (ToolDefinition("weather", "", json.dumps(WEATHER)),)
    assert (params.tool_choice, params.parse_output) == (ToolChoice("function", "weather"), True)
    counted = count_params(
        CountTokensRequest.model_validate({"model": "m", "messages": TOOL_LOOP, "tools": tools})
    )
    assert counted.tools == params.tools


USER = {"role": "user", "content": "x"}
TOOLS = [{"name": "weather", "input_schema": WEATHER}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {
                "messages": [
                    *TOOL_LOOP[:2],
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}],
                    },
                ],
                "tools": TOOLS,
            },
            "messages.2.content.0.tool_use_id: 'toolu_9': no earlier tool_use block has this id",
        ),
        (
            {"messages": TOOL_LOOP},
            "tools: tool_use and tool_result blocks need tools defined",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0.type: 'image' blocks are not supported "
            "(only text, tool_use, tool_result, thinking)",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text: Field required",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_use", "id": "a", "name": "weather", "input": []}
                        ],
                    }
                ],
                "tools": TOOLS,
            },
            "messages.0.content.0.input: Input should be a valid dictionary",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_use", "id": "a", "name": "weather", "input": {}}
                        ],
                    }
                ],
                "tools": TOOLS,
            },
            "messages.0.content.0.type: a user sends no tool_use block",
        ),
        (
            {"messages": [{"role": "user", "content": []}]},
            "messages.0.content: empty (send at least one content block)",
        ),
        (
            {"messages": [USER, {"role": "assistant", "content": "Sure"}]},
            "messages.1: a last assistant message (prefill) is not supported",
        ),
        (
            {"messages": [USER], "tools": [*TOOLS, *TOOLS]},
            "tools.1.name: 'weather': two tools of this name",
        ),
        (
            {"messages": [USER], "tools": TOOLS, "tool_choice": {"type": "tool", "name": "time"}},
            "tool_choice.name: 'time' is not one of the tools",
        ),
        (
            {"messages": [USER], "tool_choice": {"type": "any"}},
            "tool_choice: 'any' needs tools",
        ),
        (
            {"messages": [USER], "output_config": {"effort": "low"}},
            "output_config: not supported",
        ),
    ],
)
def test_bad_blocks_and_tools_are_refused_naming_the_field(body, message) -> None:
    with pytest.raises(InvalidArgument) as refused:
        chat(**body)
    assert str(refused.value) == message


def test_a_tools_field_is_named_as_anthropic_names_it() -> None:
    from zerolayer.frontend.anthropic.errors import anthropic_field

    assert anthropic_field("tools[2].parameters_json") == "tools.2.input_schema"
    assert anthropic_field("tools[0].name") == "tools.0.name"
    assert anthropic_field("stop[1]") == "stop_sequences"
