"""The Responses API (``/v1/responses``) of the real stack through the official ``openai``
client: text and item input against the chat completion of the same messages, streaming (the
exact event order, every event and body valid against OpenAI's published schemas), ``store`` with
``previous_response_id`` (the same prompt as the whole conversation sent again, its prefix
cached), GET and DELETE, ``text.format`` with a JSON schema, the errors; and a stack of its own
with two tenants, whose stored responses are each one's alone."""

from __future__ import annotations

import hashlib
import json

import openai
import pytest
from e2e.stack import chat_dummy_model, free_port, running_stack
from factories import responses_event_schema

pytestmark = pytest.mark.e2e

STORY = "Tell me a story about a small red fox who lived under an old oak tree, please."
"""A prompt of several blocks (one token a byte), for the prefix cache."""
TOKENS = {"tenant-a": "token-of-a", "tenant-b": "token-of-b"}
PICK_FORMAT = {
    "format": {
        "type": "json_schema",
        "name": "pick",
        "schema": {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green"]}},
            "required": ["colour"],
            "additionalProperties": False,
        },
    }
}
"""A ``text`` whose answer is short and ends (the grammar ends it)."""


def make_client(stack, api_key: str = "-") -> openai.OpenAI:
    base_url = f"http://{stack.config.http_listen}/v1"
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(shared_stack) -> openai.OpenAI:
    return make_client(shared_stack.stack)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def test_text_input_with_instructions_is_the_chat_of_system_and_user(client, model, openai_spec):
    raw = client.responses.with_raw_response.create(
        model=model,
        input="Hello there",
        instructions="Be brief.",
        max_output_tokens=6,
        temperature=0,
        store=False,
    )
    openai_spec("Response", raw.http_response.json())
    response = raw.parse()
    chat = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there"},
        ],
        max_tokens=6,
        temperature=0,
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    finish = chat.choices[0].finish_reason
    assert response.status == ("incomplete" if finish == "length" else "completed")
    if finish == "length":
        assert response.incomplete_details.reason == "max_output_tokens"
    assert (response.instructions, response.max_output_tokens, response.store) == (
        "Be brief.",
        6,
        False,
    )


def test_items_input_is_the_chat_of_the_same_messages(client, model) -> None:
    items = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Yes?"}]},
        {"role": "user", "content": "Go on"},
    ]
    response = client.responses.create(
        model=model, input=items, max_output_tokens=5, temperature=0, store=False
    )
    chat = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "Rules."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Yes?"},
            {"role": "user", "content": "Go on"},
        ],
        max_tokens=5,
        temperature=0,
    )
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.output_text == chat.choices[0].message.content


def test_a_stream_sends_the_responses_events_in_order(client, model, openai_spec) -> None:
    events = list(
        client.responses.create(
            model=model,
            input="Once upon",
            max_output_tokens=5,
            temperature=0,
            stream=True,
            store=False,
        )
    )
    for event in events:
        openai_spec(responses_event_schema(event.type), event.to_dict())
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        kinds[-1],
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text == events[-4].text
    whole = client.responses.create(
        model=model, input="Once upon", max_output_tokens=5, temperature=0, store=False
    )
    assert whole.output_text == text and whole.usage.output_tokens == final.usage.output_tokens


def test_the_clients_stream_helper_assembles_a_completed_response(client, model) -> None:
    """(The helper wants ``response.completed``: a JSON schema makes the answer end.)"""
    with client.responses.stream(
        model=model, input="Pick", text=PICK_FORMAT, max_output_tokens=30, store=False
    ) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == text
    assert json.loads(text)["colour"] in ("red", "green")


def test_previous_response_id_continues_the_stored_conversation(client, model) -> None:
    first = client.responses.create(model=model, input=STORY, max_output_tokens=8, temperature=0)
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = client.responses.create(
        model=model,
        input="And then?",
        previous_response_id=first.id,
        max_output_tokens=4,
        temperature=0,
        store=False,
    )
    assert second.previous_response_id == first.id
    # The same conversation sent whole, as the client would without the store.
    whole = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": STORY},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"role": "user", "content": "And then?"},
        ],
        max_output_tokens=4,
        temperature=0,
        store=False,
    )
    assert second.usage.input_tokens == whole.usage.input_tokens > first.usage.input_tokens
    assert second.output_text == whole.output_text
    # The first turn's prompt (several blocks) was cached by the first request.
    assert second.usage.input_tokens_details.cached_tokens > 0
    # store: false kept nothing.
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)


def test_a_deleted_response_is_gone(client, model) -> None:
    response = client.responses.create(model=model, input="x", max_output_tokens=2)
    page = client.responses.input_items.list(response.id)
    assert [(i.type, i.role, i.content[0].text) for i in page.data] == [("message", "user", "x")]
    assert client.responses.delete(response.id) is None
    for call in (client.responses.retrieve, client.responses.delete):
        with pytest.raises(openai.NotFoundError) as missing:
            call(response.id)
        assert missing.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as continued:
        client.responses.create(model=model, input="y", previous_response_id=response.id)
    assert continued.value.body["param"] == "previous_response_id"


def test_a_json_schema_format_gives_json_of_the_schema(client, model) -> None:
    response = client.responses.create(
        model=model,
        input="Pick a colour",
        text=PICK_FORMAT,
        max_output_tokens=30,
        store=False,
    )
    assert json.loads(response.output_text)["colour"] in ("red", "green")
    assert response.text.format.type == "json_schema"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(client, model, openai_spec, fields, param) -> None:
    body = {"model": model, "input": "x", **fields}
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=model, extra_body=body)
    assert bad.value.body["param"] == param, bad.value.body
    openai_spec("ErrorResponse", {"error": bad.value.body})


@pytest.fixture(scope="module")
def tenants_stack(tmp_path_factory: pytest.TempPathFactory):
    """The tiny dummy model with a chat template, behind --http-listen and two tenants."""
    tenants = tmp_path_factory.mktemp("tenants") / "tenants.json"
    digests = {t: [hashlib.sha256(token.encode()).hexdigest()] for t, token in TOKENS.items()}
    tenants.write_text(json.dumps(digests))
    with running_stack(
        chat_dummy_model(tmp_path_factory),
        tmp_path_factory.mktemp("logs"),
        http_listen=f"127.0.0.1:{free_port()}",
        tenants=str(tenants),
    ) as stack:
        yield stack


def test_a_stored_response_is_its_tenants_alone(tenants_stack) -> None:
    a = make_client(tenants_stack, TOKENS["tenant-a"])
    b = make_client(tenants_stack, TOKENS["tenant-b"])
    model = a.models.list().data[0].id
    response = a.responses.create(model=model, input="mine", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError) as other:
        b.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as missing:
        b.responses.retrieve("resp_" + "0" * 32)
    assert other.value.body["message"] == missing.value.body["message"].replace(
        "resp_" + "0" * 32, response.id
    )
    with pytest.raises(openai.NotFoundError) as continued:
        b.responses.create(model=model, input="x", previous_response_id=response.id)
    assert continued.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(response.id)
    assert a.responses.retrieve(response.id).id == response.id
    with pytest.raises(openai.AuthenticationError):
        make_client(tenants_stack, "wrong").responses.retrieve(response.id)
