"""End to end chat: Generate with ``messages`` on a dummy model that has a chat template
(``chat_template.jinja``) and two EOS ids in generation_config.json, against transformers'
``apply_chat_template`` and ``generate``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest
import transformers
from e2e.stack import running_stack, text_stub
from factories import MAX_NEW_TOKENS, hf_generate

from zerolayer.checkpoints.byte_tokenizer import EOS_TOKEN_ID
from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message.role == 'tool' %}{{ raise_exception('tools are not supported') }}{% endif %}"
    "<|{{ message.role }}|>\n{{ message.content | trim }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "You are a dummy."},
    {"role": "user", "content": "Hello, dummy!"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Say more."},
]


def hf_prompt_ids(model_dir: Path) -> list[int]:
    """transformers' rendering and tokenization of MESSAGES (with the generation prompt)."""
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(model_dir)
    encoding = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    return list(encoding["input_ids"])


@pytest.fixture(scope="module")
def chat_model(
    dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[int], list[int]]:
    """A copy of the dummy model with CHAT_TEMPLATE and EOS ids [2, X] in generation_config.json,
    X a token of the greedy answer (not its first); (model_dir, prompt ids, expected answer)."""
    model_dir = tmp_path_factory.mktemp("chat") / "chat-dummy"
    shutil.copytree(dummy_model_dir, model_dir)
    (model_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    prompt_ids = hf_prompt_ids(model_dir)
    answer = hf_generate(model_dir, [prompt_ids], "cpu")[0]  # greedy, EOS ignored
    # NOTE: the first token new to the answer from position 2 on, so generation must run past
    # other tokens and stop at the second EOS id (config.json's only EOS is 2)
    stop = next(k for k in range(2, len(answer)) if answer[k] not in answer[:k] and answer[k] != 2)
    assert EOS_TOKEN_ID not in answer[:stop]
    (model_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": [EOS_TOKEN_ID, answer[stop]]})
    )
    return model_dir, prompt_ids, answer[: stop + 1]


@pytest.fixture(scope="module")
def stub(chat_model, tmp_path_factory: pytest.TempPathFactory):
    with running_stack(chat_model[0], tmp_path_factory.mktemp("logs")) as stack:
        yield text_stub(stack)


def chat_request(messages: list[dict[str, str]], **fields: object) -> pb.GenerateRequest:
    chat = pb.ChatMessages(messages=[pb.ChatMessage(**m) for m in messages])
    return pb.GenerateRequest(messages=chat, max_new_tokens=MAX_NEW_TOKENS, **fields)


def test_model_info_says_the_model_has_a_chat_template(stub, chat_model) -> None:
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.has_chat_template
    assert list(info.eos_token_ids) == [EOS_TOKEN_ID, chat_model[2][-1]]


def test_chat_generates_as_the_transformers_prompt_and_stops_at_the_second_eos(
    stub, chat_model
) -> None:
    _, prompt_ids, expected = chat_model
    response = stub.Generate(chat_request(MESSAGES), timeout=60)
    assert list(response.token_ids) == expected
    assert response.finish_reason == pb.FINISH_REASON_EOS
    assert response.usage.prompt_tokens == len(prompt_ids)
    by_ids = stub.Generate(
        pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=prompt_ids), max_new_tokens=MAX_NEW_TOKENS
        ),
        timeout=60,
    )
    assert (list(by_ids.token_ids), by_ids.finish_reason) == (expected, pb.FINISH_REASON_EOS)
    streamed = list(stub.GenerateStream(chat_request(MESSAGES), timeout=60))
    assert [t for r in streamed for t in r.token_ids] == expected


def test_without_generation_prompt_the_prompt_ends_after_the_last_message(stub) -> None:
    with_prompt = chat_request(MESSAGES, ignore_eos=True)
    without = chat_request(MESSAGES, ignore_eos=True)
    without.messages.add_generation_prompt = False
    num_with, num_without = (
        stub.Generate(r, timeout=60).usage.prompt_tokens for r in (with_prompt, without)
    )
    assert num_without == num_with - len(b"<|assistant|>\n")


@pytest.mark.parametrize(
    ("messages", "details"),
    [
        ([], "messages: empty"),
        ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], "messages[1].role"),
        (
            [{"role": "tool", "content": "x", "tool_call_id": "c"}],
            "messages: the model's chat template failed: tools are not supported",
        ),
    ],
)
def test_bad_chats_are_invalid_argument(stub, messages, details) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(chat_request(messages), timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(details)
