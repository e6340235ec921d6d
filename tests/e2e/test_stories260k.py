"""A real trained model end to end: llama2.c's stories260K, converted, served by zerolayer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e.stack import running_stack, text_stub

from zerolayer.checkpoints.llama2c import convert_llama2c
from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def converted(stories_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stories260K")
    convert_llama2c(stories_dir / "stories260K.bin", stories_dir / "tok512.bin", out)
    return out


@pytest.fixture(scope="module")
def stub(converted: Path, tmp_path_factory: pytest.TempPathFactory):
    with running_stack(converted, tmp_path_factory.mktemp("logs")) as stack:
        yield text_stub(stack)


def test_reproduces_llama2c_greedy_ids_and_text(stub, stories_dir: Path) -> None:
    expected_ids = json.loads((stories_dir / "expected_greedy_200_ids.json").read_text())
    expected_text = (stories_dir / "expected_greedy_200.txt").read_text()
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=[1]), max_new_tokens=200, temperature=0.0
    )
    response = stub.Generate(request)
    assert list(response.token_ids) == expected_ids
    assert response.text == expected_text
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    streamed = list(stub.GenerateStream(request))
    assert "".join(p.text for p in streamed) == expected_text


def test_text_prompt_gets_bos_and_llama2c_tokenization(stub, stories_dir: Path) -> None:
    tokens = stub.Tokenize(pb.TokenizeRequest(text="Once upon a time", add_special_tokens=True))
    assert list(tokens.token_ids) == [1, 403, 407, 261, 378]
    expected_ids = json.loads((stories_dir / "expected_greedy_200_ids.json").read_text())
    # The expected run starts "Once upon a time"; continuing from that prompt follows it.
    response = stub.Generate(pb.GenerateRequest(prompt="Once upon a time", max_new_tokens=20))
    assert response.usage.prompt_tokens == 5
    assert list(response.token_ids) == expected_ids[4:24]


def test_stop_string_cuts_text_and_reports_stop(stub, stories_dir: Path) -> None:
    expected_text = (stories_dir / "expected_greedy_200.txt").read_text()
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=[1]),
        max_new_tokens=200,
        stop=["Lily's mom", "never-there"],
    )
    response = stub.Generate(request)
    assert response.text == expected_text[: expected_text.index("Lily's mom")]
    assert response.finish_reason == pb.FINISH_REASON_STOP
    assert response.usage.completion_tokens < 200
    streamed = list(stub.GenerateStream(request))
    assert "".join(p.text for p in streamed) == response.text
    assert streamed[-1].finish_reason == pb.FINISH_REASON_STOP


def test_story_ends_at_bos_like_llama2c(stub) -> None:
    # llama2.c's run.c stops when the model emits BOS (id 1) between stories.
    response = stub.Generate(
        pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[1]), max_new_tokens=600)
    )
    assert response.finish_reason == pb.FINISH_REASON_EOS
    assert response.token_ids[-1] == 1
    assert 1 not in response.token_ids[:-1]


def test_generation_stops_at_the_context_length(stub) -> None:
    # max_position_embeddings is 512: prompt (1) + output never exceed it.
    response = stub.Generate(
        pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=[1]), max_new_tokens=600, ignore_eos=True
        )
    )
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert response.usage.completion_tokens == 511
