"""Generations to the Responses API's response object and stream events
(zerolayer.frontend.responses.output and .events): the exact event sequence of a message, of a
reasoning model's thought and of tool calls (the seam's chunk fields), statuses at the token
limit and when given up, every body and event valid against OpenAI's published schemas."""

from __future__ import annotations

import pytest
from factories import responses_event_schema

from zerolayer.common.generation import FinishReason, GenerationChunk, Usage
from zerolayer.frontend.responses.events import ResponseEvents
from zerolayer.frontend.responses.output import ResponseHead, response_head, whole_response
from zerolayer.frontend.responses.schema import CreateResponseRequest
from zerolayer.frontend.responses.seam import ToolCallDelta

USAGE = Usage(prompt_tokens=7, completion_tokens=5, cached_prompt_tokens=4)


def head(**fields: object) -> ResponseHead:
    body = CreateResponseRequest.model_validate({"input": "x", **fields})
    return response_head(body, "abc", "tiny")


def chunk(
    text: str = "", finish: FinishReason = FinishReason.UNSPECIFIED, **seam
) -> GenerationChunk:
    usage = USAGE if finish != FinishReason.UNSPECIFIED else None
    return GenerationChunk("abc", text, (1,), finish, usage, **seam)


def stream(chunks: list[GenerationChunk]) -> tuple[list[dict], ResponseEvents]:
    encoder = ResponseEvents(head())
    events = encoder.start()
    for c in chunks:
        events += encoder.chunk(c)
    return events, encoder


def check_events(openai_spec, events: list[dict]) -> None:
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        openai_spec(responses_event_schema(event["type"]), event)


def test_a_message_streams_as_openai_sends_it(openai_spec) -> None:
    events, encoder = stream([chunk("Hel"), chunk("lo", FinishReason.EOS)])
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    check_events(openai_spec, events)
    assert [e["delta"] for e in events if e["type"].endswith(".delta")] == ["Hel", "lo"]
    final = events[-1]["response"]
    assert final == encoder.final
    (message,) = final["output"]
    assert message["content"] == [
        {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
    ]
    assert events[2]["item"]["id"] == message["id"] and message["status"] == "completed"
    assert final["usage"] == {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 3},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12,
    }
    assert final["status"] == "completed" and final["id"] == "resp_abc"
    openai_spec("Response", final)


def test_thought_answer_and_tool_calls_are_items_in_order(openai_spec) -> None:
    chunks = [
        chunk(reasoning_text="th"),
        chunk(reasoning_text="ink"),
        chunk("Sure."),
        chunk(tool_call_deltas=(ToolCallDelta(0, "c1", "f", '{"a"'),)),
        chunk(tool_call_deltas=(ToolCallDelta(0, arguments=":1}"),)),
        chunk(tool_call_deltas=(ToolCallDelta(1, "c2", "g", "{}"),)),
        chunk(finish=FinishReason.EOS),
    ]
    events, encoder = stream(chunks)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    check_events(openai_spec, events)
    assert encoder.final is not None
    output = encoder.final["output"]
    assert [i["type"] for i in output] == ["reasoning", "message", "function_call", "function_call"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": "think"}]
    assert [(i["call_id"], i["name"], i["arguments"]) for i in output[2:]] == [
        ("c1", "f", '{"a":1}'),
        ("c2", "g", "{}"),
    ]
    assert encoder.final["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}
    assert [i["output_index"] for i in events if i["type"] == "response.output_item.done"] == [
        0,
        1,
        2,
        3,
    ]
    # The whole (not streamed) response has the same items.
    whole = whole_response(head(), chunks)
    openai_spec("Response", whole)
    strip = [{k: v for k, v in i.items() if k != "id"} for i in output]
    assert [{k: v for k, v in i.items() if k != "id"} for i in whole["output"]] == strip


@pytest.mark.parametrize(
    ("finish", "status", "last"),
    [
        (FinishReason.LENGTH, "incomplete", "response.incomplete"),
        (FinishReason.ABORT, "failed", "response.failed"),
    ],
)
def test_a_response_cut_short_says_why(openai_spec, finish, status, last) -> None:
    events, encoder = stream([chunk("a", finish)])
    check_events(openai_spec, events)
    assert events[-1]["type"] == last and encoder.final is not None
    assert encoder.final["status"] == status
    if status == "incomplete":
        assert encoder.final["incomplete_details"] == {"reason": "max_output_tokens"}
        assert encoder.final["output"][0]["status"] == "incomplete"
    else:
        assert encoder.final["error"]["code"] == "server_error"
    assert whole_response(head(), [chunk("a", finish)])["status"] == status


def test_an_empty_answer_is_still_one_message() -> None:
    events, encoder = stream([chunk("", FinishReason.EOS)])
    assert encoder.final is not None and encoder.final["output"][0]["content"][0]["text"] == ""
    assert [e["type"] for e in events][2:4] == [
        "response.output_item.added",
        "response.content_part.added",
    ]


def test_the_request_is_echoed_with_openais_defaults(openai_spec) -> None:
    fields = {
        "instructions": "Be brief.",
        "max_output_tokens": 9,
        "metadata": {"k": "v"},
        "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"},
        "store": False,
        "user": "u",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": "none",
    }
    body = whole_response(head(**fields), [chunk("{}", FinishReason.EOS)])
    openai_spec("Response", body)
    assert {k: body[k] for k in ("instructions", "max_output_tokens", "metadata", "store")} == {
        "instructions": "Be brief.",
        "max_output_tokens": 9,
        "metadata": {"k": "v"},
        "store": False,
    }
    assert body["text"] == {
        "format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}
    }
    assert body["reasoning"] == {"effort": "low", "summary": None}
    assert (body["temperature"], body["top_p"], body["tool_choice"]) == (1.0, 1.0, "none")
    assert body["tools"] == [
        {
            "type": "function",
            "name": "f",
            "description": None,
            "parameters": {"type": "object"},
            "strict": None,
        }
    ]
    plain = whole_response(head(), [chunk("a", FinishReason.EOS)])
    assert (plain["store"], plain["text"], plain["instructions"]) == (
        True,
        {"format": {"type": "text"}},
        None,
    )
