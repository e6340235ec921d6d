"""The Responses API's routes (zerolayer.frontend.responses.app) over a stand-in generator whose
chunks carry the seam's reasoning and tool-call fields, served by the frontend's HTTP server and
read by the official ``openai`` client: its ``responses.stream`` helper assembles the streamed
reasoning, message and function calls into the same response the server stores. The real
generator: tests/e2e/test_responses_http.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import openai
import pytest

from zerolayer.common.generation import FinishReason, GenerateParams, GenerationChunk, Usage
from zerolayer.frontend.http_server import HttpServer, HttpServerConfig
from zerolayer.frontend.openai.app import create_app
from zerolayer.frontend.responses.app import add_responses_routes
from zerolayer.frontend.responses.seam import ToolCallDelta
from zerolayer.frontend.responses.store import ResponseStore
from zerolayer.frontend.text.validation import ServedModel

T = TypeVar("T")
CHUNKS = [
    GenerationChunk("r", "", (1,), reasoning_text="Use f."),
    GenerationChunk("r", "Calling.", (2,)),
    GenerationChunk("r", "", (3,), tool_call_deltas=(ToolCallDelta(0, "call_1", "f", '{"x":'),)),
    GenerationChunk("r", "", (4,), tool_call_deltas=(ToolCallDelta(0, arguments="2}"),)),
    GenerationChunk("r", "", (5,), FinishReason.EOS, Usage(6, 5, 0)),
]


class SeamGenerator:
    """What the routes use of a TextGenerator, giving :data:`CHUNKS` to every request."""

    def __init__(self) -> None:
        self.ready = True
        self.served = ServedModel("tiny", 259, 64)
        self.metrics = None
        self.params: list[GenerateParams] = []

    async def generate(self, params: GenerateParams, *args: object) -> AsyncIterator:
        self.params.append(params)
        for chunk in CHUNKS:
            yield chunk


def served(use: Callable[[openai.OpenAI], T]) -> T:
    async def scenario() -> T:
        app = create_app(SeamGenerator())  # type: ignore[arg-type]
        add_responses_routes(app, SeamGenerator(), ResponseStore(4, 60))  # type: ignore[arg-type]
        server = HttpServer(HttpServerConfig("127.0.0.1:0"))
        await server.start(app)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{server.port}/v1", api_key="-", max_retries=0
        )
        try:
            return await asyncio.to_thread(use, client)
        finally:
            await server.stop()

    return asyncio.run(scenario())


def test_the_clients_stream_helper_assembles_reasoning_text_and_function_calls() -> None:
    def use(client: openai.OpenAI):
        with client.responses.stream(model="tiny", input="go") as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
        return kinds, final, client.responses.retrieve(final.id)

    kinds, final, stored = served(use)
    assert kinds.count("response.function_call_arguments.delta") == 2
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "Use f."
    assert final.output_text == "Calling."
    call = final.output[2]
    assert (call.call_id, call.name, json.loads(call.arguments)) == ("call_1", "f", {"x": 2})
    # The stored response is the one streamed (the helper adds its ``parsed`` fields).
    assert [i.id for i in stored.output] == [i.id for i in final.output]
    assert stored.output[2].arguments == call.arguments and stored.output_text == "Calling."
    assert stored.usage == final.usage and stored.status == final.status == "completed"


def test_a_whole_response_has_the_same_items() -> None:
    response = served(lambda client: client.responses.create(model="tiny", input="go"))
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output[2].arguments == '{"x":2}'
    assert response.usage.total_tokens == 11


def test_input_items_are_listed_in_pages() -> None:
    items = [{"role": "user", "content": text} for text in ("a", "b", "c")]

    def use(client: openai.OpenAI):
        response = client.responses.create(model="tiny", input=items)
        first = client.responses.input_items.list(response.id, limit=2, order="asc")
        rest = client.responses.input_items.list(
            response.id, limit=2, order="asc", after=first.last_id
        )
        newest = client.responses.input_items.list(response.id)
        with pytest.raises(openai.BadRequestError) as bad:
            client.get(f"/responses/{response.id}/input_items?limit=abc", cast_to=object)
        return first, rest, newest, bad.value.body

    first, rest, newest, error = served(use)
    assert [i.content[0].text for i in first.data] == ["a", "b"] and first.has_more
    assert [i.content[0].text for i in rest.data] == ["c"] and not rest.has_more
    assert [i.content[0].text for i in newest.data] == ["c", "b", "a"]
    assert error["param"] == "limit"
