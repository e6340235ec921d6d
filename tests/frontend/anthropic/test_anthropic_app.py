"""The Messages API's routes (zerolayer.frontend.anthropic.app) on the OpenAI app, over a
stand-in generator, served by the frontend's HTTP server: an error before the first chunk as its
status and one after it as an ``error`` event, a generation given up, bodies that are not JSON or
too large, a key sent twice, and count_tokens. The real generator:
tests/e2e/test_anthropic_messages.py."""

from __future__ import annotations

import hashlib
import http.client
import json
from dataclasses import replace

import pytest
from factories import StandInGenerator, serve_app

from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import CachePin, FinishReason, GenerationChunk, Usage
from zerolayer.frontend.anthropic.app import add_routes
from zerolayer.frontend.openai.app import create_app
from zerolayer.frontend.tenants import TenantPolicy

KEY = "key-of-a"
TENANTS = TenantPolicy({hashlib.sha256(KEY.encode()).digest(): "tenant-a"})
BODY = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}


def call(
    generator: StandInGenerator,
    path: str,
    body: object,
    headers: list[tuple[str, str]] | None = None,
    tenants: TenantPolicy | None = None,
    answer_headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Serves both APIs over ``generator`` and POSTs ``body`` (JSON, or bytes as they are):
    the status and the body (the response's headers into ``answer_headers``)."""
    app = create_app(generator, tenants)  # type: ignore[arg-type]
    add_routes(app, generator, tenants)  # type: ignore[arg-type]

    def send(port: int) -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        connection.putrequest("POST", path)
        for name, value in [("content-length", str(len(data))), *(headers or [])]:
            connection.putheader(name, value)
        connection.endheaders(data)
        response = connection.getresponse()
        answer = (response.status, response.read().decode())
        (answer_headers if answer_headers is not None else {}).update(response.getheaders())
        connection.close()
        return answer

    return serve_app(app, send)


def error_of(answer: tuple[int, str]) -> tuple[int, str, str]:
    status, text = answer
    body = json.loads(text)
    assert body["type"] == "error", body
    return status, body["error"]["type"], body["error"]["message"]


def test_an_error_before_the_first_chunk_is_its_status() -> None:
    generator = StandInGenerator([Unavailable("scheduler: down")])
    answer = call(generator, "/v1/messages", {**BODY, "stream": True})
    assert error_of(answer) == (503, "overloaded_error", "scheduler: down")


def test_an_error_mid_stream_is_the_last_event() -> None:
    generator = StandInGenerator(
        [GenerationChunk("r", "a", (1,), usage=Usage(3, 1, 0)), Unavailable("scheduler: lost")]
    )
    status, text = call(generator, "/v1/messages", {**BODY, "stream": True})
    events = text.split("\n\n")
    assert status == 200 and events[-1] == ""
    assert events[-2] == (
        "event: error\n"
        'data: {"type":"error","error":{"type":"overloaded_error","message":"scheduler: lost"}}'
    )
    assert [e.split("\n")[0] for e in events[:-2]] == [
        "event: message_start",
        "event: content_block_start",
        "event: ping",
        "event: content_block_delta",
    ]


def test_a_generation_the_scheduler_gave_up_is_an_error() -> None:
    generator = StandInGenerator([GenerationChunk("r", "a", (1,), FinishReason.ABORT)])
    status, kind, message = error_of(call(generator, "/v1/messages", BODY))
    assert (status, kind) == (503, "overloaded_error") and "ABORT" in message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model": "tiny",', (400, "invalid_request_error", "request body: not JSON")),
        (b" " * 70, (413, "request_too_large", "request body: over 64 bytes")),
    ],
)
def test_a_body_that_is_not_json_or_too_large(body, expected) -> None:
    generator = StandInGenerator([])
    app = create_app(generator)  # type: ignore[arg-type]
    add_routes(app, generator, max_body_bytes=64)  # type: ignore[arg-type]

    def send(port: int) -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/v1/messages", body=body)
        response = connection.getresponse()
        return response.status, response.read().decode()

    status, kind, message = error_of(serve_app(app, send))
    assert (status, kind) == expected[:2] and message.startswith(expected[2])


@pytest.mark.parametrize(
    "headers",
    [
        [("x-api-key", KEY), ("x-api-key", KEY)],
        [("authorization", f"Bearer {KEY}"), ("authorization", f"Bearer {KEY}")],
    ],
)
def test_a_key_sent_twice_is_a_401(headers) -> None:
    answer = call(StandInGenerator([]), "/v1/messages", BODY, headers, TENANTS)
    assert error_of(answer)[:2] == (401, "authentication_error")


def test_a_tenants_key_passes_and_count_tokens_counts_the_rendered_prompt() -> None:
    chunks = [GenerationChunk("r", "ok", (1,), FinishReason.EOS, Usage(5, 1, 0))]
    generator = StandInGenerator(chunks, num_prompt_tokens=5)
    status, text = call(generator, "/v1/messages", BODY, [("x-api-key", KEY)], TENANTS)
    assert (status, json.loads(text)["content"]) == (200, [{"type": "text", "text": "ok"}])
    count = {k: v for k, v in BODY.items() if k != "max_tokens"}
    answer = call(generator, "/v1/messages/count_tokens", count, [("x-api-key", KEY)], TENANTS)
    assert answer == (200, '{"input_tokens":5}')
    assert generator.params[-1].messages == generator.params[0].messages


@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_pin_is_named_in_a_header_and_writes_nothing(stream) -> None:
    usage = Usage(8, 1, 0, pin_refusal="pin-over-namespace-budget")
    # As TextGenerator gives it: the chunk whose output made the pins names the refusal
    chunk = GenerationChunk("r", "ok", (1,), FinishReason.EOS, usage)
    generator = StandInGenerator([replace(chunk, pin_refusal=usage.pin_refusal)])
    system = [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    headers: dict[str, str] = {}
    body = {**BODY, "system": system, "stream": stream}
    status, text = call(generator, "/v1/messages", body, answer_headers=headers)
    assert (status, headers["zerolayer-pin-refusal"]) == (200, "pin-over-namespace-budget")
    assert generator.params[0].cache_pins == (CachePin(3600, message_index=0, content_offset=1),)
    assert '"cache_creation_input_tokens":0' in text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {
                "system": [
                    {
                        "type": "text",
                        "text": "S",
                        "cache_control": {"type": "ephemeral", "ttl": "2h"},
                    }
                ]
            },
            "system.0.cache_control.ttl: Input should be '5m' or '1h'",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}
                        ]
                        * 5,
                    }
                ]
            },
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
    ],
)
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_cache_control_anthropic_refuses_is_a_400_in_its_words(body, message, path) -> None:
    request = {**BODY, **body}
    if path.endswith("count_tokens"):
        del request["max_tokens"]
    answer = call(StandInGenerator([]), path, request)
    assert error_of(answer) == (400, "invalid_request_error", message)
