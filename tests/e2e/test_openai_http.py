"""The OpenAI-compatible HTTP endpoint (``--http-listen``) of the shared stack (the tiny dummy
model with a chat template): the official ``openai`` client (streamed and not), raw HTTP for the
status codes and error bodies, a client that disconnects mid-stream (its request is aborted and
its blocks freed), ``/health`` and ``/ready``; and a stack of its own with ``--tenants``,
whose HTTP generations need a tenant's bearer token. Tracing over HTTP:
tests/e2e/test_observability.py."""

from __future__ import annotations

import http.client
import json
import time

import jsonschema
import openai
import pytest
from e2e.stack import (
    chat_dummy_model,
    free_port,
    running_stack,
    scheduler_stats,
    tenants_file,
    text_stub,
)
from openai_conformance import load_spec

from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

TOKEN = "token-of-a"
"""Bearer token of the tenants stack's one tenant."""
MAX_MODEL_LEN = 2048
"""The tiny dummy model's context, tokens."""
PROMPT_IDS = [5, 6, 7, 8, 9, 10, 11, 12]


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.stack


def complete(client: openai.OpenAI, model: str, **fields: object):
    """A greedy, ignore_eos completion of "abc" (``fields`` override or add)."""
    body = {"model": model, "prompt": "abc", "temperature": 0, **fields}
    return client.completions.create(**body, extra_body={"ignore_eos": True})


def post(stack, path: str, body: object, token: str | None = None) -> tuple[int, dict]:
    """POST ``body`` (a JSON value, or bytes sent as they are), with bearer ``token`` if one:
    status and JSON answer."""
    host, _, port = stack.config.http_listen.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.request("POST", path, body=data, headers=headers)
    response = connection.getresponse()
    raw = response.read()
    connection.close()
    checked(response, "POST", path, raw)
    return response.status, json.loads(raw)


def get(stack, path: str) -> tuple[int, dict]:
    host, _, port = stack.config.http_listen.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    raw = response.read()
    connection.close()
    checked(response, "GET", path, raw)
    return response.status, json.loads(raw)


def checked(response: http.client.HTTPResponse, method: str, path: str, raw: bytes) -> None:
    """Checks an answer against OpenAI's schemas (tests/openai_conformance.py)."""
    spec = load_spec()
    if spec is not None:
        content_type = response.getheader("content-type", "")
        spec.check_answer(method, path, response.status, content_type, raw)


def grpc_text(stack, ids: list[int], max_new_tokens: int) -> str:
    """The text of the same greedy, ignore_eos generation over gRPC."""
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=ids), max_new_tokens=max_new_tokens, ignore_eos=True
    )
    return text_stub(stack).Generate(request, timeout=60).text


def test_models_lists_the_served_model(stack, client) -> None:
    (card,) = client.models.list().data
    info = text_stub(stack).GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert (card.id, card.object, card.owned_by) == (info.model, "model", "zerolayer")
    assert card.created > 0
    assert client.models.retrieve(card.id).id == card.id


def test_a_completion_is_the_grpc_generation_with_usage(stack, client, model) -> None:
    completion = complete(client, model, prompt=PROMPT_IDS, max_tokens=6)
    (choice,) = completion.choices
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    assert (choice.index, choice.finish_reason, choice.logprobs) == (0, "length", None)
    assert completion.usage.prompt_tokens == len(PROMPT_IDS)
    assert completion.usage.completion_tokens == 6
    assert completion.usage.total_tokens == len(PROMPT_IDS) + 6
    assert choice.text == grpc_text(stack, PROMPT_IDS, 6)


def test_a_streamed_completion_joins_to_the_unary_one_and_ends_with_usage(client, model) -> None:
    kwargs = {"model": model, "prompt": "Once upon", "max_tokens": 5, "temperature": 0}
    whole = client.completions.create(**kwargs, extra_body={"ignore_eos": True})
    chunks = list(
        client.completions.create(
            **kwargs,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    *texts, last = chunks
    assert "".join(c.choices[0].text for c in texts) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in texts][-1] == "length"
    assert all(c.usage is None for c in texts)
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        whole.usage.prompt_tokens,
        5,
    )


def test_a_stop_string_ends_the_completion_with_stop(client, model) -> None:
    whole = complete(client, model, max_tokens=8)
    stop = whole.choices[0].text[2:4]
    assert stop, whole.choices[0].text
    stopped = complete(client, model, max_tokens=8, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == whole.choices[0].text.split(stop)[0]


def test_the_client_raises_openai_errors(client, model) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=model, prompt="x", temperature=-1)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no-such-model", prompt="x")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError) as retrieved:
        client.models.retrieve("no-such-model")
    assert retrieved.value.body == missing.value.body


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"prompt": "x", "temperature": -1}, "temperature", ["temperature"]),
        ({"prompt": "x", "temperature": "hot"}, "temperature", ["number"]),
        ({"prompt": "x", "temperature": 1e308}, "temperature", ["float32"]),
        ({"prompt": "x", "repetition_penalty": 3.5e39}, "repetition_penalty", ["float32"]),
        ({"prompt": "x", "top_p": 0}, "top_p", ["(0, 1]"]),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", ["greater than or equal to 1"]),
        ({"prompt": "x", "bogus": 1}, "bogus", ["unrecognized"]),
        ({"prompt": "x", "echo": True}, "echo", ["not supported"]),
        ({"prompt": "x", "best_of": 2}, "best_of", ["not supported"]),
        ({"prompt": ["a", "b"]}, "prompt", ["2 prompts"]),
        ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias", ["not a token id"]),
        ({"prompt": [1, 2, 1_000_000]}, "prompt", ["vocab_size"]),
        ({}, "prompt", ["required"]),
        (
            {"prompt": PROMPT_IDS, "max_tokens": MAX_MODEL_LEN},
            "max_tokens",
            [str(MAX_MODEL_LEN), str(MAX_MODEL_LEN + 8), "8 in the prompt", f"{MAX_MODEL_LEN} in"],
        ),
    ],
)
def test_a_bad_completion_is_a_400_naming_the_field(stack, body, param, words) -> None:
    status, answer = post(stack, "/v1/completions", body)
    error = answer["error"]
    assert (status, error["type"], error["param"]) == (400, "invalid_request_error", param)
    assert all(word in error["message"] for word in words), error["message"]


def test_a_context_overflow_has_openais_code(stack) -> None:
    status, answer = post(stack, "/v1/completions", {"prompt": PROMPT_IDS, "max_tokens": 4000})
    assert (status, answer["error"]["code"]) == (400, "context_length_exceeded")


def test_malformed_json_is_a_400(stack) -> None:
    status, answer = post(stack, "/v1/completions", b'{"prompt": "x",')
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert "JSON" in answer["error"]["message"]


def test_a_body_over_8_mib_is_a_413(stack) -> None:
    status, answer = post(stack, "/v1/completions", b" " * (8 * 1024 * 1024 + 1))
    assert (status, answer["error"]["message"]) == (413, "request body: over 8388608 bytes")


def test_a_get_of_a_post_route_is_a_405_in_openais_shape(stack) -> None:
    status, answer = get(stack, "/v1/completions")
    assert (status, answer["error"]["type"]) == (405, "invalid_request_error")


def test_an_unknown_model_is_a_404(stack) -> None:
    status, answer = post(stack, "/v1/completions", {"model": "gpt-x", "prompt": "x"})
    assert (status, answer["error"]["code"], answer["error"]["param"]) == (
        404,
        "model_not_found",
        "model",
    )
    assert "'gpt-x'" in answer["error"]["message"]
    assert get(stack, "/v1/models/gpt-x") == (404, answer)
    # An unknown route is not a missing model.
    status, answer = get(stack, "/v1/nothing")
    assert (status, answer["error"]["code"]) == (404, None)


@pytest.fixture(scope="module")
def tenants_stack(tmp_path_factory: pytest.TempPathFactory):
    """The tiny dummy model with a chat template, behind --http-listen and --tenants."""
    model_dir = chat_dummy_model(tmp_path_factory)
    tenants = tenants_file(tmp_path_factory.mktemp("tenants"), {TOKEN: "tenant-a"})
    with running_stack(
        model_dir,
        tmp_path_factory.mktemp("logs"),
        http_listen=f"127.0.0.1:{free_port()}",
        tenants=str(tenants),
    ) as stack:
        yield stack


@pytest.mark.parametrize("token", [None, "wrong"])
def test_generation_needs_a_tenants_bearer_token(tenants_stack, token) -> None:
    status, answer = post(tenants_stack, "/v1/completions", {"prompt": "x"}, token=token)
    assert (status, answer["error"]["code"]) == (401, "invalid_api_key")
    assert "wrong" not in answer["error"]["message"]


def test_the_official_clients_api_key_is_a_tenants_bearer_token(tenants_stack, openai_spec) -> None:
    base_url = f"http://{tenants_stack.config.http_listen}/v1"
    client = openai_spec.client(base_url, api_key=TOKEN)
    (card,) = client.models.list().data
    completion = complete(client, card.id, prompt=PROMPT_IDS, max_tokens=3)
    assert completion.usage.completion_tokens == 3
    unidentified = openai_spec.client(base_url, api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        unidentified.completions.create(model=card.id, prompt="x")
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=PROMPT_IDS), max_new_tokens=3, ignore_eos=True
    )
    grpc_answer = text_stub(tenants_stack).Generate(request, timeout=60, metadata=metadata)
    assert completion.choices[0].text == grpc_answer.text


def test_an_unknown_path_is_a_404_in_openais_shape(stack) -> None:
    status, answer = get(stack, "/v1/embeddings")
    assert status == 404 and answer["error"]["message"].startswith("/v1/embeddings")


def test_health_and_ready(stack) -> None:
    assert get(stack, "/health") == (200, {"status": "ok"})
    assert get(stack, "/ready") == (200, {"status": "ready"})


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_ends_its_request_and_frees_its_blocks(stack, stream) -> None:
    """The request ends when its client goes, mid-stream or while waiting for the whole
    response: its blocks are freed within seconds, long before the engine steps its max_tokens
    would take."""
    max_tokens = MAX_MODEL_LEN - 2 * len(PROMPT_IDS)
    steps_before = scheduler_stats(stack).num_steps
    host, _, port = stack.config.http_listen.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {"prompt": PROMPT_IDS, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    headers = {"content-type": "application/json"}
    connection.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
    if stream:
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("content-type").startswith("text/event-stream")
        assert response.readline().startswith(b"data: {")
    else:
        while not scheduler_stats(stack).num_blocks_held:
            time.sleep(0.01)
    assert scheduler_stats(stack).num_blocks_held > 0  # still generating
    connection.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stats = scheduler_stats(stack)
        if (stats.num_running, stats.num_waiting, stats.num_blocks_held) == (0, 0, 0):
            break
        time.sleep(0.05)
    assert (stats.num_running, stats.num_waiting, stats.num_blocks_held) == (0, 0, 0)
    assert stats.num_steps - steps_before < max_tokens // 2


CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hi."},
]


def test_a_chat_completion_and_its_stream(client, model) -> None:
    kwargs = {"model": model, "messages": CHAT, "max_tokens": 5, "temperature": 0}
    whole = client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True})
    (choice,) = whole.choices
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert (choice.message.role, choice.finish_reason) == ("assistant", "length")
    assert whole.usage.completion_tokens == 5
    chunks = list(
        client.chat.completions.create(
            **kwargs,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    *deltas, last = chunks
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in deltas) == choice.message.content
    assert (last.choices, last.usage.completion_tokens) == ([], 5)


def test_n_completions_are_choices_by_index(client, model) -> None:
    completion = complete(client, model, max_tokens=4, n=2, temperature=1, seed=7)
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.usage.completion_tokens == 8
    # Sample i is drawn with seed + i: each equals a lone request with that seed.
    alone = [complete(client, model, max_tokens=4, temperature=1, seed=s) for s in (7, 8)]
    assert [c.text for c in completion.choices] == [a.choices[0].text for a in alone]


def test_n_streams_each_sample_under_its_index(client, model) -> None:
    whole = complete(client, model, max_tokens=4, n=3, temperature=1, seed=11)
    stream = complete(
        client,
        model,
        max_tokens=4,
        n=3,
        temperature=1,
        seed=11,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, finished, usage = ["", "", ""], [None] * 3, None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finished[choice.index] = choice.finish_reason or finished[choice.index]
        usage = chunk.usage or usage
    assert texts == [c.text for c in whole.choices]
    assert finished == ["length"] * 3
    assert usage.completion_tokens == 12


def test_completion_logprobs_have_openais_shape(client, model) -> None:
    completion = complete(client, model, max_tokens=4, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 4
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    assert all(lp <= 0 for lp in logprobs.token_logprobs)


def test_prompt_logprobs_cover_the_prompt_after_a_null(client, model) -> None:
    completion = client.completions.create(
        model=model, prompt=PROMPT_IDS, max_tokens=1, extra_body={"prompt_logprobs": 1}
    )
    first, *rest = completion.choices[0].prompt_logprobs
    assert first is None
    assert all(str(i) in entry for i, entry in zip(PROMPT_IDS[1:], rest, strict=True))


def test_chat_logprobs_have_openais_shape(client, model) -> None:
    completion = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    content = completion.choices[0].logprobs.content
    assert len(content) == completion.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 for c in content)
    # The tokens are the text they stand for, their bytes its UTF-8 (tokens/test_logprob_tokens)
    text = completion.choices[0].message.content
    assert "".join(c.token for c in content) == text
    assert bytes(b for c in content for b in c.bytes).decode(errors="replace") == text


def test_a_json_schema_response_format_gives_valid_json(client, model) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}},
        "required": ["name"],
        "additionalProperties": False,
    }
    completion = client.completions.create(
        model=model,
        prompt="JSON:",
        max_tokens=40,
        temperature=0,
        extra_body={
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": schema},
            }
        },
    )
    jsonschema.validate(json.loads(completion.choices[0].text), schema)
