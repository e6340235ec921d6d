"""A /v1/responses body to its generation (zerolayer.frontend.responses.request and .items):
text and item input, instructions, developer messages, text.format, previous conversations, the
seam's tool-call shapes, and what is refused, naming the field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import StructuredOutput
from zerolayer.frontend.responses import items as items_module
from zerolayer.frontend.responses.items import ItemError, chat_messages, parse_items
from zerolayer.frontend.responses.request import response_request
from zerolayer.frontend.responses.schema import CreateResponseRequest
from zerolayer.frontend.responses.seam import ChatMessage, ToolCall, ToolChoice
from zerolayer.frontend.responses.store import StoredResponse


def ask(previous: StoredResponse | None = None, **fields: object):
    body = CreateResponseRequest.model_validate({"model": "tiny", **fields})
    return response_request(body, "abc", previous)


def test_a_text_input_is_one_user_message_after_the_instructions() -> None:
    asked = ask(input="Hi", instructions="Be brief.", max_output_tokens=5, temperature=0)
    assert asked.params.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"))
    assert (asked.params.max_new_tokens, asked.params.temperature) == (5, 0)
    assert asked.params.request_id == "abc" and asked.params.model == "tiny"
    assert asked.input_items == ({"type": "message", "role": "user", "content": "Hi"},)


def test_items_become_messages_developer_as_system_and_text_parts_joined() -> None:
    asked = ask(
        input=[
            {"role": "developer", "content": "Rules."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a"},
                    {"type": "input_text", "text": "b"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "c", "annotations": [], "logprobs": []}
                ],
            },
            {"role": "user", "content": "d"},
        ]
    )
    assert asked.params.messages == (
        ChatMessage("system", "Rules."),
        ChatMessage("user", "ab"),
        ChatMessage("assistant", "c"),
        ChatMessage("user", "d"),
    )
    assert asked.params.temperature == 1.0  # OpenAI's default


def test_a_previous_conversation_comes_first_without_its_instructions() -> None:
    first = ask(input="one", instructions="Sys.")
    output = {
        "type": "message",
        "role": "assistant",
        "id": "msg_x",
        "status": "completed",
        "content": [{"type": "output_text", "text": "two", "annotations": [], "logprobs": []}],
    }
    previous = StoredResponse(
        "resp_1", "", {}, first.input_items, (*first.conversation, output), 0.0
    )
    asked = ask(previous, input="three")
    assert asked.params.messages == (
        ChatMessage("user", "one"),
        ChatMessage("assistant", "two"),
        ChatMessage("user", "three"),
    )
    assert asked.conversation == (*previous.conversation, *asked.input_items)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ({"format": {"type": "text"}}, None),
        ({"format": {"type": "json_object"}}, StructuredOutput("json_object")),
        (
            {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            StructuredOutput("json_schema", '{"type": "object"}'),
        ),
    ],
)
def test_text_format_is_the_structured_output(text: dict, expected) -> None:
    assert ask(input="x", text=text).params.structured_output == expected


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"type": "input_image"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": "x", "colour": 1}]}, "input[0].colour"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "top_logprobs": 2}, "top_logprobs"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
        (
            {
                "input": "x",
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "tool_choice",
        ),
        ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ],
)
def test_what_is_not_served_is_refused_naming_the_field(fields: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        ask(**fields)
    assert refused.value.field == field


def test_tools_with_tool_choice_none_are_accepted() -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    asked = ask(input="x", tools=tools, tool_choice="none")
    assert asked.params.messages == (ChatMessage("user", "x"),)


@pytest.fixture
def with_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """The translation as it runs once the seam's tool machinery is in the build."""
    monkeypatch.setattr(items_module, "needs_tools", lambda field: None)


def test_function_calls_and_outputs_are_the_seams_tool_calls_and_tool_messages(with_tools) -> None:
    conversation = parse_items(
        [
            {"role": "user", "content": "weather?"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "think"}],
            },
            {"type": "message", "role": "assistant", "content": "Let me look."},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"a":1}'},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "rain"}],
            },
            {"type": "function_call", "call_id": "c3", "name": "v", "arguments": "{}"},
        ]
    )
    assert chat_messages(conversation, None, 0) == (
        ChatMessage("user", "weather?"),
        ChatMessage(
            "assistant",
            "Let me look.",
            tool_calls=(ToolCall("c1", "w", '{"a":1}'), ToolCall("c2", "w", "{}")),
            reasoning_content="think",
        ),
        ChatMessage("tool", "sunny", tool_call_id="c1"),
        ChatMessage("tool", "rain", tool_call_id="c2"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("c3", "v", "{}"),)),
    )


def test_an_output_for_no_call_is_refused_naming_its_call_id(with_tools) -> None:
    stored = parse_items([{"type": "function_call", "call_id": "c1", "name": "w", "arguments": ""}])
    new = parse_items([{"type": "function_call_output", "call_id": "c9", "output": "x"}])
    with pytest.raises(ItemError) as refused:
        chat_messages((*stored, *new), None, len(stored))
    assert refused.value.field == "input[0].call_id"
    assert "'c9'" in str(refused.value)
    # The call in the stored conversation answers an output sent now.
    ok = parse_items([{"type": "function_call_output", "call_id": "c1", "output": "x"}])
    assert chat_messages((*stored, *ok), None, 1)[-1] == replace(
        ChatMessage("tool", "x"), tool_call_id="c1"
    )


def test_tool_choice_names_a_tool_of_the_request() -> None:
    from zerolayer.frontend.responses.request import _tool_choice

    assert _tool_choice({"type": "function", "name": "f"}, {"f"}) == ToolChoice("function", "f")
    assert _tool_choice("required", set()) == ToolChoice("required")
    assert _tool_choice(None, set()) is None


def test_a_tools_schema_is_named_parameters() -> None:
    from zerolayer.frontend.responses.errors import responses_param

    assert responses_param("tools[1].parameters_json") == "tools[1].parameters"
    assert responses_param("messages[3].role") == "input"
