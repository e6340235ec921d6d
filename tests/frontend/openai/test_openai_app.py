"""The OpenAI-compatible app (zerolayer.frontend.openai.app) over a stand-in generator, served
by the frontend's HTTP server: readiness, the exact SSE framing of a stream, an error before the
first chunk as a status and one after it as an event, an unknown model as OpenAI's
``model_not_found`` (through the official client, against OpenAI's published spec). The real
generator:
tests/e2e/test_openai_http.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import openai
from factories import StandInGenerator, serve_app
from openai_conformance import load_spec

from zerolayer.common.errors import NotFound, Unavailable
from zerolayer.common.generation import FinishReason, GenerationChunk, Usage
from zerolayer.frontend.openai.app import create_app
from zerolayer.frontend.text.validation import ServedModel, check_model

T = TypeVar("T")


def served(generator: StandInGenerator, use: Callable[[int], T]) -> T:
    """Serves the app over ``generator`` on a free port and returns ``use(port)`` (run in a
    thread, so it may block)."""
    return serve_app(create_app(generator), use)  # type: ignore[arg-type]


def call(generator: StandInGenerator, path: str, body: dict | None = None) -> tuple[int, bytes]:
    """Serves the app over ``generator`` and sends one request: its status and body."""

    def send(port: int) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    return served(generator, send)


def client_error(generator: StandInGenerator, request: Callable[[openai.OpenAI], object]) -> Any:
    """The error the official client raises for ``request`` to the app over ``generator``."""

    def send(port: int) -> Exception:
        client = load_spec().client(f"http://127.0.0.1:{port}/v1")  # answers checked
        try:
            request(client)
        except openai.APIError as exc:
            return exc
        raise AssertionError("the request succeeded")

    return served(generator, send)


def test_ready_follows_the_generator_and_health_does_not() -> None:
    assert call(StandInGenerator([], ready=True), "/ready") == (200, b'{"status":"ready"}')
    status, body = call(StandInGenerator([], ready=False), "/ready")
    assert (status, json.loads(body)["error"]["type"]) == (503, "server_error")
    assert call(StandInGenerator([], ready=False), "/health") == (200, b'{"status":"ok"}')


def test_a_stream_is_sse_events_with_usage_then_done() -> None:
    generator = StandInGenerator(
        [
            GenerationChunk("r", "Hel", (1, 2)),
            GenerationChunk("r", "lo", (3,), FinishReason.EOS, Usage(2, 3, 0)),
        ]
    )
    body = {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    status, data = call(generator, "/v1/completions", body)
    events = data.decode().split("\n\n")
    assert status == 200 and events[-2:] == ["data: [DONE]", ""]
    bodies = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert [b["choices"] for b in bodies] == [
        [{"index": 0, "text": "Hel", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": "lo", "logprobs": None, "finish_reason": "stop"}],
        [],
    ]
    assert bodies[-1]["usage"]["total_tokens"] == 5
    assert len({b["id"] for b in bodies}) == 1 and bodies[0]["id"].startswith("cmpl-")
    assert bodies[0]["id"] == f"cmpl-{generator.params[0].request_id}"


def test_an_error_before_the_first_chunk_is_its_status() -> None:
    status, data = call(
        StandInGenerator([Unavailable("scheduler: down")]),
        "/v1/completions",
        {
            "prompt": "x",
            "stream": True,
        },
    )
    assert (status, json.loads(data)["error"]["message"]) == (503, "scheduler: down")


def test_an_error_mid_stream_is_an_event_before_done() -> None:
    chunks = [GenerationChunk("r", "a", (1,)), Unavailable("scheduler: lost twice")]
    status, data = call(
        StandInGenerator(chunks),
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
        },
    )
    events = data.decode().split("\n\n")
    assert status == 200 and events[-2:] == ["data: [DONE]", ""]
    error = json.loads(events[1].removeprefix("data: "))["error"]
    assert (error["message"], error["type"]) == ("scheduler: lost twice", "server_error")


def test_retrieving_a_model_that_is_not_served_is_openais_model_not_found(openai_spec) -> None:
    error = client_error(StandInGenerator([]), lambda client: client.models.retrieve("gpt-x"))
    assert isinstance(error, openai.NotFoundError)
    assert (error.code, error.param, error.type) == (
        "model_not_found",
        "model",
        "invalid_request_error",
    )
    assert "gpt-x" in error.message and "tiny" in error.message
    openai_spec("ErrorResponse", error.response.json())


def test_generating_with_a_model_that_is_not_served_answers_the_same(openai_spec) -> None:
    try:
        check_model("gpt-x", ServedModel("tiny", 259, 64))
    except NotFound as exc:
        refusal = exc
    error = client_error(
        StandInGenerator([refusal]),
        lambda client: client.completions.create(model="gpt-x", prompt="x"),
    )
    assert isinstance(error, openai.NotFoundError)
    retrieved = client_error(StandInGenerator([]), lambda client: client.models.retrieve("gpt-x"))
    assert error.response.json() == retrieved.response.json()
    openai_spec("ErrorResponse", error.response.json())


def test_the_served_model_is_retrieved() -> None:
    status, body = call(StandInGenerator([]), "/v1/models/tiny")
    assert (status, json.loads(body)["id"]) == (200, "tiny")
