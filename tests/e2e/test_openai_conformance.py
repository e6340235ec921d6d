"""Conformance of the shared stack's OpenAI-compatible HTTP endpoint with OpenAI's specification,
through the official client (every answer checked against the spec's schemas,
tests/openai_conformance.py): the client's echo of its own answer, null as every nullable
field's default, the spec's metadata-only fields accepted, what cannot be done refused naming
the field, malformed prompts answered 400 (not 500), logprob tokens that join to the text."""

from __future__ import annotations

import http.client
import json

import openai
import pytest

pytestmark = pytest.mark.e2e

CHAT = [{"role": "user", "content": "Say hi."}]


def chat(client, model, **fields):
    body = {"model": model, "messages": CHAT, "max_tokens": 4, "temperature": 0, **fields}
    return client.chat.completions.create(**body)


def test_the_clients_echo_of_its_own_answer_is_accepted(client, model) -> None:
    first = chat(client, model)
    echo = first.choices[0].message.model_dump()
    assert echo["refusal"] is None and echo["tool_calls"] is None  # nulls included
    messages = [*CHAT, echo, {"role": "user", "content": "Again."}]
    second = chat(client, model, messages=messages)
    assert second.choices[0].message.role == "assistant"


def test_null_is_every_nullable_fields_default(client, model) -> None:
    nulls = dict.fromkeys(
        [
            "n", "stream", "logprobs", "top_logprobs", "stop", "seed", "presence_penalty",
            "frequency_penalty", "logit_bias", "top_p", "stream_options", "response_format",
            "store", "metadata", "service_tier", "modalities", "audio", "prediction",
            "web_search_options", "safety_identifier", "prompt_cache_key", "verbosity",
            "prompt_cache_retention", "max_completion_tokens", "moderation",
        ]
    )  # fmt: skip
    with_nulls = chat(client, model, extra_body=nulls)
    assert with_nulls.choices[0].message.content == chat(client, model).choices[0].message.content
    completion = client.completions.create(
        model=model,
        prompt="abc",
        max_tokens=3,
        temperature=0,
        extra_body=dict.fromkeys(["n", "echo", "best_of", "suffix", "logprobs", "stream"]),
    )
    assert completion.choices[0].finish_reason in ("stop", "length")


def test_metadata_only_fields_are_accepted_and_ignored(client, model) -> None:
    plain = chat(client, model).choices[0].message.content
    tagged = chat(
        client,
        model,
        metadata={"team": "a"},
        store=True,
        service_tier="auto",
        user="u-1",
        safety_identifier="s-1",
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        modalities=["text"],
        verbosity="low",
        prediction={"type": "content", "content": "hi"},
        extra_body={"prompt_cache_options": {"ttl": "30m"}},
    )
    assert tagged.choices[0].message.content == plain
    stream = chat(client, model, stream=True, stream_options={"include_obfuscation": True})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == plain


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"n": 17}, "n"),
    ],
)
def test_what_cannot_be_done_is_a_400_naming_the_field(client, model, fields, param) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, model, **fields)
    assert refused.value.body["param"] == param


@pytest.mark.parametrize("prompt", [[-1], [[3, -1]]])
def test_a_malformed_prompt_is_a_400_not_a_500(client, model, prompt) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=model, prompt=prompt, max_tokens=2)
    assert refused.value.body["param"] == "prompt"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "a\ud800"}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"content": "\ud800", "role": "user"}]}, None),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_its_field(shared_stack, openai_spec, path, body, param):
    """Valid JSON (the official client cannot send it: it writes UTF-8), but no Unicode text."""
    host, _, port = shared_stack.stack.config.http_listen.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"content-type": "application/json"}
    connection.request("POST", path, body=json.dumps(body).encode(), headers=headers)
    response = connection.getresponse()
    raw = response.read()
    connection.close()
    content_type = response.getheader("content-type", "")
    openai_spec.check_answer("POST", path, response.status, content_type, raw)
    error = json.loads(raw)["error"]
    assert (response.status, error["param"]) == (400, param or "messages[0].content")
    assert "lone surrogate \\ud800" in error["message"]


def test_the_stop_parameter_takes_a_string_or_a_list(client, model) -> None:
    whole = chat(client, model, max_tokens=8, extra_body={"ignore_eos": True})
    text = whole.choices[0].message.content
    stop = text[2:3]
    for value in (stop, [stop, "never"]):
        stopped = chat(client, model, max_tokens=8, stop=value, extra_body={"ignore_eos": True})
        assert stopped.choices[0].message.content == text.split(stop)[0]


@pytest.mark.parametrize("stream", [False, True])
def test_logprob_tokens_join_to_the_text_and_their_bytes_to_its_utf8(client, model, stream):
    kwargs = {"max_tokens": 12, "logprobs": True, "top_logprobs": 3, "temperature": 1, "seed": 5}
    if not stream:
        choice = chat(client, model, **kwargs).choices[0]
        text, content = choice.message.content, choice.logprobs.content
    else:
        chunks = [c for c in chat(client, model, stream=True, **kwargs) if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        content = [
            t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content
        ]
    assert "".join(t.token for t in content) == text
    joined = bytes(b for t in content for b in t.bytes)
    assert joined.decode(errors="replace") == text
    assert not any(t.token.startswith("Ġ") for t in content)
