"""Generation chunks to Anthropic's message object and event stream
(zerolayer.frontend.anthropic.response, .stream): content blocks, stop reasons, usage, and the
exact events of a stream, text only and with a thought and tool calls (the seam's chunks)."""

from __future__ import annotations

import pytest

from zerolayer.common.errors import Unavailable

# NOTE: the seam's types (issue 30); after i30-tools merges: zerolayer.common.generation.
from zerolayer.common.generation import FinishReason, GenerationChunk, ToolCallDelta, Usage
from zerolayer.frontend.anthropic.response import (
    MessageHead,
    message_body,
    stop_reason,
    usage_body,
)
from zerolayer.frontend.anthropic.stream import MessageStreamEncoder, sse
from zerolayer.frontend.http_exchange import generation_refusal, pin_refusal_headers

HEAD = MessageHead("msg_1", "tiny")
NO_CREATION = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}


def tool_chunks() -> list[GenerationChunk]:
    """A thought, a text and two calls whose arguments come in pieces."""
    return [
        GenerationChunk("r", "", (1,), reasoning_text="Two ", usage=Usage(9, 1, 4)),
        GenerationChunk("r", "", (2,), reasoning_text="calls.", usage=Usage(9, 2, 4)),
        GenerationChunk("r", "Checking.", (3,), usage=Usage(9, 3, 4)),
        GenerationChunk(
            "r", "", (4,), tool_call_deltas=(ToolCallDelta(0, "toolu_a", "weather", '{"ci'),)
        ),
        GenerationChunk(
            "r",
            "",
            (5, 6),
            tool_call_deltas=(
                ToolCallDelta(0, arguments='ty": "Paris"}'),
                ToolCallDelta(1, "toolu_b", "time", "{}"),
            ),
            finish_reason=FinishReason.TOOL_CALLS,
            usage=Usage(9, 6, 4),
        ),
    ]


def test_a_text_message_has_one_text_block_and_anthropics_usage() -> None:
    chunks = [
        GenerationChunk("r", "Hel", (1,)),
        GenerationChunk("r", "lo", (2,), FinishReason.EOS, Usage(10, 2, 4)),
    ]
    assert message_body(HEAD, chunks) == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello"}],
        "model": "tiny",
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 6,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 4,
            "cache_creation": NO_CREATION,
            "output_tokens": 2,
        },
    }


@pytest.mark.parametrize(
    ("reason", "stop_string", "expected"),
    [
        (FinishReason.EOS, "", ("end_turn", None)),
        (FinishReason.LENGTH, "", ("max_tokens", None)),
        (FinishReason.STOP, "END", ("stop_sequence", "END")),
        (FinishReason.STOP, "", ("end_turn", None)),  # a stop token id: no sequence
        (FinishReason.TOOL_CALLS, "", ("tool_use", None)),
    ],
)
def test_stop_reasons(reason, stop_string, expected) -> None:
    assert stop_reason(reason, stop_string) == expected


def test_a_generation_given_up_is_an_error() -> None:
    with pytest.raises(Unavailable, match="ABORT"):
        stop_reason(FinishReason.ABORT, "")


def test_thought_text_and_calls_are_blocks_in_order() -> None:
    body = message_body(HEAD, tool_chunks())
    assert body["content"] == [
        {"type": "thinking", "thinking": "Two calls.", "signature": ""},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_a", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_b", "name": "time", "input": {}},
    ]
    assert (body["stop_reason"], body["usage"]["output_tokens"]) == ("tool_use", 6)


def encode(chunks: list[GenerationChunk], head: MessageHead = HEAD) -> list[tuple[str, dict]]:
    encoder = MessageStreamEncoder(head)
    return [event for chunk in chunks for event in encoder.chunk(chunk)]


def delta(index: int, **body: str) -> tuple[str, dict]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": body})


def start(index: int, **block: object) -> tuple[str, dict]:
    body = {"type": "content_block_start", "index": index, "content_block": block}
    return ("content_block_start", body)


def stop(index: int) -> tuple[str, dict]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


def test_a_text_stream_is_anthropics_event_sequence() -> None:
    events = encode(
        [
            GenerationChunk("r", "Hel", (1,), usage=Usage(10, 1, 0)),
            GenerationChunk("r", "", (2,), usage=Usage(10, 2, 0)),  # held back: no event
            GenerationChunk("r", "lo", (3,), FinishReason.STOP, Usage(10, 3, 0), stop_string="!"),
        ]
    )
    usage = {
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": NO_CREATION,
    }
    assert events == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "tiny",
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 10, **usage, "output_tokens": 1},
                },
            },
        ),
        start(0, type="text", text=""),
        ("ping", {"type": "ping"}),
        delta(0, type="text_delta", text="Hel"),
        delta(0, type="text_delta", text="lo"),
        stop(0),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "stop_sequence", "stop_sequence": "!"},
                "usage": {"input_tokens": 10, **usage, "output_tokens": 3},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_thought_text_and_calls_stream_as_blocks_of_their_deltas() -> None:
    events = encode(tool_chunks())
    assert events[1:-2] == [
        start(0, type="thinking", thinking="", signature=""),
        ("ping", {"type": "ping"}),
        delta(0, type="thinking_delta", thinking="Two "),
        delta(0, type="thinking_delta", thinking="calls."),
        stop(0),
        start(1, type="text", text=""),
        delta(1, type="text_delta", text="Checking."),
        stop(1),
        start(2, type="tool_use", id="toolu_a", name="weather", input={}),
        delta(2, type="input_json_delta", partial_json='{"ci'),
        delta(2, type="input_json_delta", partial_json='ty": "Paris"}'),
        stop(2),
        start(3, type="tool_use", id="toolu_b", name="time", input={}),
        delta(3, type="input_json_delta", partial_json="{}"),
        stop(3),
    ]
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_an_empty_answer_still_has_a_text_block() -> None:
    events = encode([GenerationChunk("r", "", (2,), FinishReason.EOS, Usage(3, 1, 0))])
    assert [kind for kind, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_an_event_has_its_name_and_its_data() -> None:
    assert sse("ping", {"type": "ping"}) == 'event: ping\ndata: {"type":"ping"}\n\n'


@pytest.mark.parametrize(
    ("pin_ttl_s", "by_ttl"),
    [(300, (16, 0)), (3600, (0, 16)), (0, (16, 0))],
)
def test_usage_splits_the_prompt_into_read_written_and_the_rest(pin_ttl_s, by_ttl) -> None:
    """40 prompt tokens, 8 read from the cache, 16 written by the pins: input_tokens is the
    other 16; the written tokens are all the longest breakpoint's ttl."""
    usage = Usage(40, 3, 8, cache_write_prompt_tokens=16, pinned_prompt_tokens=24)
    assert usage_body(usage, pin_ttl_s) == {
        "input_tokens": 16,
        "cache_creation_input_tokens": 16,
        "cache_read_input_tokens": 8,
        "cache_creation": {
            "ephemeral_5m_input_tokens": by_ttl[0],
            "ephemeral_1h_input_tokens": by_ttl[1],
        },
        "output_tokens": 3,
    }


def test_a_refused_pin_writes_nothing_and_says_why_in_a_header() -> None:
    refused = Usage(40, 3, 8, pin_refusal="pin-over-budget")
    assert usage_body(refused, 3600)["cache_creation_input_tokens"] == 0
    assert usage_body(refused, 3600)["input_tokens"] == 32
    chunks = [GenerationChunk("r", "a", (1,)), GenerationChunk("r", "b", (2,), usage=refused)]
    refusal = generation_refusal(chunks)
    assert pin_refusal_headers(refusal) == {"zerolayer-pin-refusal": "pin-over-budget"}
    assert generation_refusal(chunks[:1]) == "" and pin_refusal_headers("") == {}


def test_a_stream_carries_the_pins_usage_from_message_start_on() -> None:
    """The pins are made before the first chunk: message_start already counts them."""
    written = Usage(10, 1, 0, cache_write_prompt_tokens=8)
    chunks = [
        GenerationChunk("r", "a", (1,), usage=written),
        GenerationChunk("r", "b", (2,), FinishReason.EOS, Usage(10, 2, 0, 8)),
    ]
    events = encode(chunks, MessageHead("msg_1", "tiny", pin_ttl_s=3600))
    creation = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 8}
    start_usage = events[0][1]["message"]["usage"]
    delta_usage = events[-2][1]["usage"]
    assert (start_usage["input_tokens"], start_usage["cache_creation"]) == (2, creation)
    assert (delta_usage["cache_creation_input_tokens"], delta_usage["output_tokens"]) == (8, 2)
    assert delta_usage["cache_creation"] == creation
