"""Generation chunks to OpenAI response bodies (zerolayer.frontend.openai.response)."""

from __future__ import annotations

import json

from zerolayer.common.generation import (
    FinishReason,
    GenerationChunk,
    PositionLogprobs,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from zerolayer.frontend.openai.response import ResponseHead, StreamEncoder, whole_response

COMPLETION = ResponseHead("cmpl-r", 1700000000, "tiny", chat=False)
CHAT = ResponseHead("chatcmpl-r", 1700000000, "tiny", chat=True)
USAGE = Usage(prompt_tokens=4, completion_tokens=3, cached_prompt_tokens=2)
USAGE_BODY = {
    "prompt_tokens": 4,
    "completion_tokens": 3,
    "total_tokens": 7,
    "prompt_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 2},
}


def named(token_id: int, logprob: float, text: str) -> TokenLogprob:
    """A token whose vocab piece (``"Ġ..."``) is not its text, as on byte-level vocabularies."""
    return TokenLogprob(token_id, logprob, f"Ġ{text}", text, text.encode())


def position(token: str, logprob: float, *top: tuple[str, float]) -> PositionLogprobs:
    return PositionLogprobs(named(1, logprob, token), 1, tuple(named(2, lp, t) for t, lp in top))


def chunks() -> list[GenerationChunk]:
    """Two samples interleaved: index 1 ends first, on EOS; index 0 on LENGTH."""
    return [
        GenerationChunk("r", "He", (1,), index=0, logprobs=(position("He", -0.5, ("He", -0.5)),)),
        GenerationChunk("r", "Yo", (2,), FinishReason.EOS, index=1),
        GenerationChunk(
            "r", "y", (3,), FinishReason.LENGTH, USAGE, 0, (position("y", -1.0, ("y", -1.0)),)
        ),
    ]


def test_a_whole_completion_has_a_choice_per_index_and_the_usage(openai_spec) -> None:
    body = whole_response(COMPLETION, chunks(), logprobs=True)
    openai_spec("CreateCompletionResponse", body)
    assert body == {
        "id": "cmpl-r",
        "object": "text_completion",
        "created": 1700000000,
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "text": "Hey",
                "logprobs": {
                    "tokens": ["He", "y"],
                    "token_logprobs": [-0.5, -1.0],
                    "top_logprobs": [{"He": -0.5}, {"y": -1.0}],
                    "text_offset": [0, 2],
                },
                "finish_reason": "length",
            },
            {
                "index": 1,
                "text": "Yo",
                "logprobs": {
                    "tokens": [],
                    "token_logprobs": [],
                    "top_logprobs": [],
                    "text_offset": [],
                },
                "finish_reason": "stop",
            },
        ],
        "usage": USAGE_BODY,
    }


def test_a_whole_chat_completion_has_messages_and_chat_logprobs(openai_spec) -> None:
    body = whole_response(CHAT, chunks()[:1] + chunks()[2:], logprobs=True)
    openai_spec("CreateChatCompletionResponse", body)
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hey",
        "refusal": None,
        "annotations": [],
    }
    assert choice["logprobs"]["content"][0] == {
        "token": "He",
        "logprob": -0.5,
        "bytes": [72, 101],
        "top_logprobs": [{"token": "He", "logprob": -0.5, "bytes": [72, 101]}],
    }
    assert choice["logprobs"]["refusal"] is None
    without = whole_response(CHAT, chunks(), logprobs=False)
    openai_spec("CreateChatCompletionResponse", without)
    assert without["choices"][0]["logprobs"] is None


def test_the_tokens_of_chat_logprobs_join_to_the_content_and_their_bytes_to_its_utf8() -> None:
    """A character split over two tokens: the first adds no text, its bytes are its own."""
    euro = "€".encode()
    split = [
        PositionLogprobs(TokenLogprob(1, -0.1, "Ġa", "a", b"a"), 1),
        PositionLogprobs(TokenLogprob(2, -0.2, "â", "", euro[:1]), 1),
        PositionLogprobs(TokenLogprob(3, -0.3, "Ĥ¬", "€", euro[1:]), 1),
    ]
    chunk = GenerationChunk("r", "a€", (1, 2, 3), FinishReason.LENGTH, USAGE, 0, tuple(split))
    content = whole_response(CHAT, [chunk], logprobs=True)["choices"][0]["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == "a€"
    assert bytes(b for c in content for b in c["bytes"]).decode() == "a€"


def test_a_completion_stream_offsets_logprobs_per_choice_and_ends_with_usage(openai_spec) -> None:
    encoder = StreamEncoder(COMPLETION, logprobs=True, include_usage=True)
    events = [encoder.chunk(c) for c in chunks()]
    for event in [*events, encoder.usage()]:
        openai_spec.check_answer(
            "POST",
            "/v1/completions",
            200,
            "text/event-stream",
            f"data: {json.dumps(event)}\n\n".encode(),
        )
    assert [e["choices"][0]["text"] for e in events] == ["He", "Yo", "y"]
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, "stop", "length"]
    assert events[2]["choices"][0]["logprobs"]["text_offset"] == [2]
    assert all(e["usage"] is None and e["object"] == "text_completion" for e in events)
    assert encoder.usage() == {
        "id": "cmpl-r",
        "object": "text_completion",
        "created": 1700000000,
        "model": "tiny",
        "choices": [],
        "usage": USAGE_BODY,
    }


def test_a_chat_stream_sends_the_role_first_and_an_empty_last_delta(openai_spec) -> None:
    encoder = StreamEncoder(CHAT, logprobs=False)
    stream = [
        GenerationChunk("r", "Hi", (1,)),
        GenerationChunk("r", " there", (2,)),
        GenerationChunk("r", "", (), FinishReason.STOP, USAGE),
    ]
    events = [encoder.chunk(c) for c in stream]
    for event in events:
        openai_spec("CreateChatCompletionStreamResponse", event)
    assert [e["choices"][0]["delta"] for e in events] == [
        {"role": "assistant", "content": "Hi"},
        {"content": " there"},
        {},
    ]
    assert events[0]["object"] == "chat.completion.chunk" and "usage" not in events[0]
    assert encoder.usage() is None


def test_continuous_usage_is_on_every_chunk_once_known() -> None:
    encoder = StreamEncoder(COMPLETION, logprobs=False, continuous_usage=True)
    events = [encoder.chunk(c) for c in chunks()]
    assert [e["usage"] for e in events] == [None, None, USAGE_BODY]


def test_prompt_logprobs_are_vllms_after_a_null_first_position() -> None:
    second = PositionLogprobs(named(7, -2.0, "b"), 3, (named(9, -0.1, "x"),))
    third = PositionLogprobs(named(8, -0.2, "c"), 1, (named(8, -0.2, "c"),))
    stream = [
        GenerationChunk("r", "", (), prompt_logprobs=(second,)),
        GenerationChunk("r", "y", (3,), FinishReason.LENGTH, USAGE, prompt_logprobs=(third,)),
    ]
    expected = [
        None,
        {
            "9": {"logprob": -0.1, "rank": 1, "decoded_token": "x"},
            "7": {"logprob": -2.0, "rank": 3, "decoded_token": "b"},
        },
        {"8": {"logprob": -0.2, "rank": 1, "decoded_token": "c"}},
    ]
    (choice,) = whole_response(COMPLETION, stream, logprobs=False)["choices"]
    assert choice["prompt_logprobs"] == expected
    encoder = StreamEncoder(COMPLETION, logprobs=False)
    events = [encoder.chunk(c)["choices"][0]["prompt_logprobs"] for c in stream]
    assert events == [expected[:2], expected[2:]]
    assert "prompt_logprobs" not in whole_response(COMPLETION, chunks(), False)["choices"][0]


def tool_stream() -> list[GenerationChunk]:
    """A thought, then two calls whose arguments come in pieces."""
    return [
        GenerationChunk("r", "", (1,), reasoning_text="Hm."),
        GenerationChunk("r", "", (2,), tool_call_deltas=(ToolCallDelta(0, "call_a", "f", "{"),)),
        GenerationChunk("r", "", (3,)),
        GenerationChunk(
            "r",
            "",
            (4,),
            FinishReason.TOOL_CALLS,
            USAGE,
            tool_call_deltas=(ToolCallDelta(0, arguments="}"), ToolCallDelta(1, "call_b", "g")),
        ),
    ]


def test_a_chat_answer_carries_its_calls_and_thought() -> None:
    choice = whole_response(CHAT, tool_stream(), logprobs=False)["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "annotations": [],
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": ""}},
        ],
        "reasoning_content": "Hm.",
    }
    assert choice["finish_reason"] == "tool_calls"


def test_a_chat_stream_sends_calls_as_openais_deltas() -> None:
    encoder = StreamEncoder(CHAT, logprobs=False)
    events = [encoder.chunk(c) for c in tool_stream()]
    assert [e["choices"][0]["delta"] for e in events] == [
        {"role": "assistant", "reasoning_content": "Hm."},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{"},
                }
            ]
        },
        {},
        {
            "tool_calls": [
                {"index": 0, "function": {"arguments": "}"}},
                {
                    "index": 1,
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "g", "arguments": ""},
                },
            ]
        },
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
