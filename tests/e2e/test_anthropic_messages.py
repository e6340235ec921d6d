"""The Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) on a stack of
its own: the tiny dummy model with the ChatML template (``zerolayer make-dummy --chat-template
chatml``), behind ``--http-listen`` and ``--tenants``, through the official ``anthropic``
client and raw HTTP. The prompt rendered from Anthropic's shape is transformers'
``apply_chat_template`` of the same chat: the answer is the greedy answer the gRPC API gives to
transformers' token ids, and the counts are its length."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import anthropic
import pytest
import transformers
from e2e.stack import free_port, running_stack, tenants_file, text_stub

from zerolayer.checkpoints.chat_templates import write_chat_template
from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

DOC = Path(__file__).resolve().parents[2] / "docs" / "anthropic-messages.md"
"""Its examples run here, against this stack."""

TOKEN = "token-of-a"
"""The key of the stack's tenant-a."""
PIN_TOKEN = "token-of-b"
"""The key of tenant-b, whose cache only the prompt-caching test uses (it starts empty)."""
SYSTEM = "You are a tiny model."
CHAT = [
    {"role": "user", "content": "Hello there."},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Tell me a story."},
]
MAX_TOKENS = 8
BLOCK_SIZE = 16
"""The stack's ``--block-size`` (the default): pins and the prefix cache hold whole blocks."""


@pytest.fixture(scope="module")
def model_dir(dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("anthropic") / "chatml-dummy"
    shutil.copytree(dummy_model_dir, model_dir)
    write_chat_template(model_dir, "chatml")
    return model_dir


@pytest.fixture(scope="module")
def stack(model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """``model_dir`` behind --http-listen and --tenants (TOKEN is tenant-a's key, PIN_TOKEN
    tenant-b's)."""
    tokens = {TOKEN: "tenant-a", PIN_TOKEN: "tenant-b"}
    tenants = tenants_file(tmp_path_factory.mktemp("tenants"), tokens)
    logs = tmp_path_factory.mktemp("logs")
    http_listen = f"127.0.0.1:{free_port()}"
    with running_stack(model_dir, logs, http_listen=http_listen, tenants=str(tenants)) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(stack) -> anthropic.Anthropic:
    base_url = f"http://{stack.config.http_listen}"
    return anthropic.Anthropic(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> str:
    return model_dir.name


def hf_prompt_ids(model_dir: Path, system: str, chat: list[dict]) -> list[int]:
    """transformers' rendering and tokenization of ``chat`` after ``system``."""
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(model_dir)
    messages = [{"role": "system", "content": system}, *chat]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])


def grpc_answer(stack, prompt_ids: list[int], **fields: object) -> pb.GenerateResponse:
    """The gRPC API's greedy answer to ``prompt_ids``."""
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=prompt_ids), max_new_tokens=MAX_TOKENS, **fields
    )
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    return text_stub(stack).Generate(request, timeout=60, metadata=metadata)


def greedy(model: str, **fields: object) -> dict:
    """The arguments of a greedy message answering CHAT after SYSTEM (``fields`` override or
    add). NOTE: ``temperature`` goes as ``extra_body``: the anthropic client (2.x) no longer
    has sampling arguments; Anthropic's API, and this one, take them."""
    body = {"model": model, "system": SYSTEM, "messages": CHAT, "max_tokens": MAX_TOKENS}
    return {**body, "extra_body": {"temperature": 0}, **fields}


def create(client: anthropic.Anthropic, model: str, **fields: object) -> anthropic.types.Message:
    """A greedy message answering CHAT after SYSTEM (``fields`` override or add)."""
    return client.messages.create(**greedy(model, **fields))  # type: ignore[call-overload]


def post(
    stack, path: str, body: object, headers: dict[str, str | None] | None = None
) -> tuple[int, str, str]:
    """POST ``body`` as JSON with the tenant's key (``headers`` override or add; a header whose
    value is None is not sent): the status, content type and body."""
    headers = {"x-api-key": TOKEN, "anthropic-version": "2023-06-01", **(headers or {})}
    host, _, port = stack.config.http_listen.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    sent = {k: v for k, v in headers.items() if v is not None}
    connection.request("POST", path, body=json.dumps(body).encode(), headers=sent)
    response = connection.getresponse()
    answer = (response.status, response.getheader("content-type", ""), response.read().decode())
    connection.close()
    return answer


def test_the_prompt_is_transformers_rendering_and_the_answer_its_greedy_answer(
    client, model, model_dir, stack
) -> None:
    prompt_ids = hf_prompt_ids(model_dir, SYSTEM, CHAT)
    expected = grpc_answer(stack, prompt_ids)
    message = create(client, model, metadata={"user_id": "user-1"})
    assert message.content[0].type == "text"
    assert message.content[0].text == expected.text
    reasons = {pb.FINISH_REASON_EOS: "end_turn", pb.FINISH_REASON_LENGTH: "max_tokens"}
    assert message.stop_reason == reasons[expected.finish_reason]
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == len(prompt_ids)
    assert (usage.cache_creation_input_tokens, usage.output_tokens) == (
        0,
        expected.usage.completion_tokens,
    )
    assert message.id.startswith("msg_") and (message.role, message.model) == ("assistant", model)
    counted = client.messages.count_tokens(model=model, system=SYSTEM, messages=CHAT)  # type: ignore[arg-type]
    assert counted.input_tokens == len(prompt_ids)


def test_system_blocks_are_joined_with_newlines(client, model, model_dir, stack) -> None:
    blocks = [
        {"type": "text", "text": "You are tiny.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer briefly."},
    ]
    chat = [{"role": "user", "content": [{"type": "text", "text": "A story?"}]}]
    same_chat = [{"role": "user", "content": "A story?"}]
    prompt_ids = hf_prompt_ids(model_dir, "You are tiny.\nAnswer briefly.", same_chat)
    message = create(client, model, system=blocks, messages=chat)
    assert message.content[0].text == grpc_answer(stack, prompt_ids).text  # type: ignore[union-attr]
    counted = client.messages.count_tokens(model=model, system=blocks, messages=chat)  # type: ignore[arg-type]
    usage = message.usage
    read_or_written = usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert counted.input_tokens == usage.input_tokens + read_or_written
    assert counted.input_tokens == len(prompt_ids)


def test_an_earlier_thought_is_not_in_a_template_without_reasoning(client, model, model_dir):
    """ChatML has no place for ``reasoning_content``: the prompt is transformers' rendering
    of the chat without the thought."""
    thought = {"type": "thinking", "thinking": "Say hi back.", "signature": "unchecked"}
    turn = {"role": "assistant", "content": [thought, {"type": "text", "text": "Hi."}]}
    chat = [CHAT[0], turn, CHAT[2]]
    counted = client.messages.count_tokens(model=model, system=SYSTEM, messages=chat)
    assert counted.input_tokens == len(hf_prompt_ids(model_dir, SYSTEM, CHAT))


def test_the_stream_helper_gives_the_same_message(client, model) -> None:
    whole = create(client, model)
    with client.messages.stream(**greedy(model)) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text  # type: ignore[union-attr]
    assert [(b.type, b.text) for b in final.content] == [("text", text)]  # type: ignore[union-attr]
    assert (final.stop_reason, final.stop_sequence) == (whole.stop_reason, None)
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == (
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    )


def test_the_clients_raw_events_join_to_the_same_message(client, model) -> None:
    whole = create(client, model)
    events = list(client.messages.create(**greedy(model), stream=True))  # type: ignore[call-overload]
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"]  # the client drops the ping
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [event.delta for event in events if event.type == "content_block_delta"]
    assert "".join(d.text for d in deltas) == whole.content[0].text  # type: ignore[union-attr]
    assert events[-2].delta.stop_reason == whole.stop_reason


def test_raw_stream_events_are_anthropics_sequence(stack, model) -> None:
    body = {"model": model, "messages": CHAT, "max_tokens": 3, "temperature": 0, "stream": True}
    status, content_type, text = post(stack, "/v1/messages", body)
    assert status == 200 and content_type.startswith("text/event-stream")
    events = [e.split("\n") for e in text.split("\n\n") if e]
    names = [lines[0].removeprefix("event: ") for lines in events]
    datas = [json.loads(lines[1].removeprefix("data: ")) for lines in events]
    assert [d["type"] for d in datas] == names, text
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = datas[0]["message"]
    assert (start["content"], start["stop_reason"]) == ([], None)
    _, _, counted = post(stack, "/v1/messages/count_tokens", {"model": model, "messages": CHAT})
    usage = start["usage"]
    num_prompt_tokens = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert num_prompt_tokens == json.loads(counted)["input_tokens"] > 0
    assert datas[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert datas[-2]["usage"]["output_tokens"] == 3


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_ends_the_message_with_stop_sequence(client, model, stream) -> None:
    whole = create(client, model).content[0].text  # type: ignore[union-attr]
    stop = whole[2:4]
    assert len(stop) == 2 and whole.index(stop) == 2, whole
    fields = {"stop_sequences": ["never-there", stop]}
    if stream:
        with client.messages.stream(**greedy(model, **fields)) as events:  # type: ignore[arg-type]
            stopped = events.get_final_message()
    else:
        stopped = create(client, model, **fields)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert stopped.content[0].text == whole[:2]  # type: ignore[union-attr]


def test_max_tokens_ends_the_message_with_max_tokens(client, model) -> None:
    message = create(client, model, max_tokens=2)
    assert (message.stop_reason, message.usage.output_tokens) == ("max_tokens", 2)


def test_fields_that_carry_no_meaning_here_are_accepted(client, model) -> None:
    whole = create(client, model)
    message = create(
        client,
        model,
        metadata={"user_id": "user-1"},
        service_tier="auto",
        speed="standard",
        inference_geo="eu",
        thinking={"type": "adaptive"},
    )
    assert message.content == whole.content


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": CHAT}, "max_tokens: Field required"),
        (
            {"messages": [{"role": "system", "content": "x"}], "max_tokens": 4},
            "messages.0.role: Input should be 'user' or 'assistant'",
        ),
        (
            {"messages": CHAT, "max_tokens": 4, "top_k": "many"},
            "top_k: Input should be a valid integer",
        ),
        (
            {"messages": CHAT, "max_tokens": 4, "temperature": 2},
            "temperature: Input should be less than or equal to 1",
        ),
        (
            {
                "messages": CHAT,
                "max_tokens": 4,
                "tools": [{"name": "t", "input_schema": {}, "defer_loading": True}],
            },
            "tools.0.defer_loading: Input should be False",
        ),
        ({"messages": CHAT, "max_tokens": 4, "container": "c"}, "container: not supported"),
        ({"messages": CHAT, "max_tokens": 4, "bogus": 1}, "bogus: Extra inputs are not permitted"),
        ({"messages": CHAT, "max_tokens": 4, "stop_sequences": [""] * 2000}, "stop_sequences: "),
        (
            {"messages": CHAT, "max_tokens": 4000},
            "max_tokens: this model's maximum context length is 2048 tokens",
        ),
        (
            {
                "messages": CHAT,
                "max_tokens": 4,
                "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
            },
            "tools: the model's chat template writes no tool-call format",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}
                        ],
                    }
                ],
                "max_tokens": 4,
                "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
            },
            "messages.0.content.0.tool_use_id: 'toolu_x': no earlier tool_use block",
        ),
    ],
)
def test_a_bad_request_is_a_400_in_anthropics_shape_naming_the_field(
    stack, model, body, message
) -> None:
    status, _, text = post(stack, "/v1/messages", {"model": model, **body})
    assert status == 400, text
    error = json.loads(text)
    assert (error["type"], error["error"]["type"]) == ("error", "invalid_request_error")
    assert error["error"]["message"].startswith(message), error


def test_the_client_raises_anthropics_errors(client, model) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model=model,
            max_tokens=4,
            messages=[{"role": "system", "content": "x"}],  # type: ignore[list-item]
        )
    assert bad.value.body["error"]["message"].startswith("messages.0.role")  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-x", max_tokens=4, messages=CHAT)  # type: ignore[arg-type]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "'claude-x'" in missing.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-x", messages=CHAT)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "headers",
    [
        {"x-api-key": "wrong"},
        {"x-api-key": ""},
        {"x-api-key": None, "authorization": "Bearer wrong"},
        {"x-api-key": None},
    ],
)
def test_a_caller_without_a_tenants_key_is_a_401(stack, model, headers) -> None:
    body = {"model": model, "messages": CHAT, "max_tokens": 2}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        status, _, text = post(stack, path, body, headers)
        assert status == 401, text
        error = json.loads(text)["error"]
        assert error["type"] == "authentication_error" and "wrong" not in error["message"]


def test_the_key_may_come_as_a_bearer_token_and_the_clients_key_is_checked(stack, model) -> None:
    body = {"model": model, "messages": CHAT, "max_tokens": 2}
    bearer = {"authorization": f"Bearer {TOKEN}"}
    status, _, _ = post(stack, "/v1/messages", body, {"x-api-key": "", **bearer})
    assert status == 401  # an x-api-key, when sent, decides
    status, _, text = post(stack, "/v1/messages", body, {"x-api-key": None, **bearer})
    assert (status, json.loads(text)["usage"]["output_tokens"]) == (200, 2)
    unknown = anthropic.Anthropic(
        base_url=f"http://{stack.config.http_listen}", api_key="wrong", max_retries=0
    )
    with pytest.raises(anthropic.AuthenticationError):
        unknown.messages.create(model=model, max_tokens=2, messages=CHAT)  # type: ignore[arg-type]


PINNED = "Pinned: answer in one word, and never in more than one."
"""A system prompt no other test sends: its prefix is not cached before the first test here."""
EPHEMERAL = {"type": "ephemeral"}


def pinned_system(rest: str) -> list[dict]:
    """PINNED with a breakpoint, then ``rest`` (a second system block)."""
    return [
        {"type": "text", "text": PINNED, "cache_control": EPHEMERAL},
        {"type": "text", "text": rest},
    ]


def tokens_before(
    model_dir: Path, system: str, text_end: str, user: str = CHAT[2]["content"]
) -> tuple[int, int]:
    """transformers' prompt of ``system`` and ``user``: the tokens before the end of its first
    ``text_end``, and its length."""
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(model_dir)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    end = text.index(text_end) + len(text_end)
    before = tokenizer(text[:end], add_special_tokens=False)["input_ids"]
    return len(os.path.commonprefix([before, ids])), len(ids)


def test_a_system_breakpoint_writes_its_prefix_once_and_later_calls_read_it(
    stack, model, model_dir
) -> None:
    """The pin holds the whole blocks before the breakpoint: the first call writes them (it
    read nothing: tenant-b's cache is empty), a call that differs right after the breakpoint
    reads exactly them, an identical call reads every whole block of its prompt (pinned or not)
    and writes nothing, and its stream's message_start says so already."""
    base_url = f"http://{stack.config.http_listen}"
    client = anthropic.Anthropic(base_url=base_url, api_key=PIN_TOKEN, max_retries=0, timeout=60)
    n, length = tokens_before(model_dir, f"{PINNED}\nFirst.", PINNED)
    assert n // BLOCK_SIZE == (n + 1) // BLOCK_SIZE > 0  # the next block is not shared
    chat = [CHAT[2]]
    first = create(client, model, system=pinned_system("First."), messages=chat, max_tokens=1)
    written = n // BLOCK_SIZE * BLOCK_SIZE
    usage = first.usage
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (0, written)
    assert usage.input_tokens == length - written
    assert usage.cache_creation.ephemeral_5m_input_tokens == written  # type: ignore[union-attr]
    other = create(client, model, system=pinned_system("Other."), messages=chat, max_tokens=1)
    assert (other.usage.cache_read_input_tokens, other.usage.cache_creation_input_tokens) == (
        written,
        0,
    )
    again = create(client, model, system=pinned_system("First."), messages=chat, max_tokens=1)
    read = (length - 1) // BLOCK_SIZE * BLOCK_SIZE  # a lookup leaves the last token
    assert (again.usage.cache_read_input_tokens, again.usage.cache_creation_input_tokens) == (
        read,
        0,
    )
    assert again.usage.input_tokens == length - read
    fields = greedy(model, system=pinned_system("First."), messages=chat, max_tokens=1)
    events = iter(client.messages.create(**fields, stream=True))  # type: ignore[call-overload]
    start = next(events)
    assert start.type == "message_start"
    assert start.message.usage.cache_read_input_tokens == read
    assert [event.type for event in events][-1] == "message_stop"


def test_the_requests_own_breakpoint_pins_up_to_its_last_message(client, model, model_dir):
    """Automatic caching: the pin ends after the last message's text. Two calls part after
    ``Once more``: the second reads the blocks they share and writes the rest of its pin (as
    tenant-a, whose other prompts share less with them)."""
    system = f"{PINNED}\nFirst."
    written = []
    for user in ("Once more?", "Once more, and this time make it a much longer story."):
        chat = [{"role": "user", "content": user}]
        fields = {"messages": chat, "max_tokens": 1, "cache_control": EPHEMERAL}
        message = create(client, model, system=pinned_system("First."), **fields)
        end, _ = tokens_before(model_dir, system, user, user)
        pinned = end // BLOCK_SIZE * BLOCK_SIZE
        usage = message.usage
        assert usage.cache_read_input_tokens + usage.cache_creation_input_tokens == pinned
        written.append(usage)
    shared, _ = tokens_before(model_dir, system, "Once more", "Once more?")
    read = shared // BLOCK_SIZE * BLOCK_SIZE
    assert written[1].cache_read_input_tokens == read
    assert written[1].cache_creation_input_tokens > 0


@pytest.mark.parametrize("path", ["create", "count_tokens"])
def test_breakpoints_anthropic_refuses_are_its_400s(client, model, path) -> None:
    call = getattr(client.messages, path)
    text = {"type": "text", "text": "Hello.", "cache_control": EPHEMERAL}
    body = greedy(model, messages=[{"role": "user", "content": [text] * 5}])
    if path == "count_tokens":
        body = {k: v for k, v in body.items() if k in ("model", "system", "messages")}
    with pytest.raises(anthropic.BadRequestError) as refused:
        call(**body)
    message = "A maximum of 4 blocks with cache_control may be provided. Found 5."
    assert refused.value.body["error"] == {"type": "invalid_request_error", "message": message}  # type: ignore[index]
    bad_ttl = {**text, "cache_control": {"type": "ephemeral", "ttl": "2h"}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        call(**{**body, "messages": [{"role": "user", "content": [text, bad_ttl]}]})
    error = refused.value.body["error"]  # type: ignore[index]
    expected = "messages.0.content.1.cache_control.ttl: Input should be '5m' or '1h'"
    assert (error["type"], error["message"]) == ("invalid_request_error", expected)


def doc_examples(stack, model: str) -> tuple[str, str]:
    """The Python and the shell example of docs/anthropic-messages.md, pointed at ``stack``."""
    python, shell = re.findall(r"^```(?:python)?\n(.*?)^```$", DOC.read_text(), re.M | re.S)[:2]
    listen = stack.config.http_listen
    python = python.replace("127.0.0.1:8000", listen).replace("unused-without-tenants", TOKEN)
    shell = shell.replace("127.0.0.1:8000", listen).replace("unused-without-tenants", TOKEN)
    return python, shell.replace('"model": "dummy"', f'"model": "{model}"')


def test_the_docs_examples_run(stack, model) -> None:
    python, shell = doc_examples(stack, model)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(python, {})
    assert int(printed.getvalue().splitlines()[-1]) > 0, printed.getvalue()
    curl = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    message, counted = (json.loads(line) for line in curl.stdout.replace("}{", "}\n{").split("\n"))
    assert message["type"] == "message", message
    assert (
        counted["input_tokens"]
        == message["usage"]["input_tokens"] + message["usage"]["cache_read_input_tokens"]
    )
