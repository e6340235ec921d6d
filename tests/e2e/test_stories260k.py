"""A real trained model end to end: llama2.c's stories260K, converted, served by zerolayer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
import jsonschema
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


@pytest.fixture(scope="module")
def hf_log_softmax(converted: Path):
    """ids -> float32 [len(ids), vocab] log-softmax of transformers' LlamaForCausalLM logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)

    def forward(ids: list[int]):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)

    return forward


def assert_logprobs_match(entries, ids: list[int], reference, num_top: int) -> None:
    """Entry i holds the logprob of ``ids[i]`` under ``reference`` row i, its rank and top-N."""
    assert len(entries) == len(ids)
    for entry, token_id, row in zip(entries, ids, reference, strict=True):
        assert entry.chosen.token_id == token_id
        assert entry.chosen.logprob == pytest.approx(row[token_id].item(), abs=1e-4)
        assert entry.rank == int((row > row[token_id]).sum()) + 1
        values, top_ids = row.topk(num_top)
        assert [t.token_id for t in entry.top] == top_ids.tolist()
        assert [t.logprob for t in entry.top] == pytest.approx(values.tolist(), abs=1e-4)
        assert all(t.token for t in entry.top)


def test_logprobs_and_prompt_logprobs_match_transformers_also_with_a_cached_prompt(
    stub, stories_dir: Path, hf_log_softmax
) -> None:
    expected_ids = json.loads((stories_dir / "expected_greedy_200_ids.json").read_text())
    prompt = [1, *expected_ids[:39]]  # 40 tokens: its full blocks enter the prefix cache
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=prompt),
        max_new_tokens=6,
        temperature=0.8,
        seed=7,
        logprobs=5,
        prompt_logprobs=3,
    )
    first = stub.Generate(request)
    reference = hf_log_softmax(prompt + list(first.token_ids))
    assert_logprobs_match(first.logprobs, list(first.token_ids), reference[39:45], 5)
    assert_logprobs_match(first.prompt_logprobs, prompt[1:], reference[:39], 3)
    # The prompt is now cached: a plain request reuses it, one with prompt logprobs does not.
    plain = stub.Generate(pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=prompt), seed=7))
    assert plain.usage.cached_prompt_tokens > 0
    second = stub.Generate(request)
    assert second.usage.cached_prompt_tokens == 0
    assert list(second.prompt_logprobs) == list(first.prompt_logprobs)
    assert list(second.logprobs) == list(first.logprobs)
    streamed = list(stub.GenerateStream(request))
    assert list(streamed[0].prompt_logprobs) == list(first.prompt_logprobs)
    assert not any(m.prompt_logprobs for m in streamed[1:])
    assert [e for m in streamed for e in m.logprobs] == list(first.logprobs)


def test_stop_token_id_ends_with_stop_and_its_text_is_left_out(stub, stories_dir: Path) -> None:
    expected_ids = json.loads((stories_dir / "expected_greedy_200_ids.json").read_text())
    stop_id = expected_ids[5]
    assert stop_id not in expected_ids[:5]
    before = stub.Generate(
        pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[1]), max_new_tokens=5)
    )
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=[1]), max_new_tokens=50, stop_token_ids=[stop_id, 3]
    )
    response = stub.Generate(request)
    assert list(response.token_ids) == expected_ids[:6]
    assert response.finish_reason == pb.FINISH_REASON_STOP
    assert response.text == before.text
    streamed = list(stub.GenerateStream(request))
    assert "".join(m.text for m in streamed) == before.text
    assert streamed[-1].finish_reason == pb.FINISH_REASON_STOP
    # min_new_tokens keeps the stop id from ending generation before 6 tokens.
    held = stub.Generate(
        pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=[1]),
            max_new_tokens=10,
            min_new_tokens=6,
            stop_token_ids=[stop_id],
        )
    )
    assert list(held.token_ids[:5]) == expected_ids[:5]
    assert held.token_ids[5] != stop_id


def test_logit_bias_and_penalties_steer_greedy_tokens_and_bad_values_are_named(
    stub, stories_dir: Path, hf_log_softmax
) -> None:
    expected_ids = json.loads((stories_dir / "expected_greedy_200_ids.json").read_text())
    banned = expected_ids[0]
    response = stub.Generate(
        pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=[1]), max_new_tokens=1, logit_bias={banned: -100.0}
        )
    )
    row = hf_log_softmax([1])[0]
    row[banned] = float("-inf")
    assert list(response.token_ids) == [int(row.argmax())]
    # A strong frequency penalty changes the greedy story (it repeats tokens otherwise).
    penalized = stub.Generate(
        pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=[1]), max_new_tokens=40, frequency_penalty=2.0
        )
    )
    assert list(penalized.token_ids) != expected_ids[:40]
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(pb.GenerateRequest(prompt="a", min_p=1.5))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("min_p: ")


STRUCTURED_SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "mood": {"enum": ["happy", "sad", "sleepy"]},
            "toys": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        },
        "required": ["name", "age", "mood", "toys"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "done": {"type": "boolean"},
            "count": {"type": "integer", "minimum": -5, "maximum": 5},
            "tags": {
                "type": "array",
                "items": {"enum": ["cat", "dog"]},
                "minItems": 1,
                "maxItems": 2,
            },
        },
        "required": ["done", "count", "tags"],
        "additionalProperties": False,
    },
]


@pytest.mark.parametrize("schema", STRUCTURED_SCHEMAS)
def test_every_sampled_output_parses_and_matches_its_json_schema(stub, schema: dict) -> None:
    for seed in range(4):
        response = stub.Generate(
            pb.GenerateRequest(
                prompt="Once upon a time",
                max_new_tokens=200,
                temperature=1.0,
                seed=seed,
                structured_output=pb.StructuredOutput(json_schema=json.dumps(schema)),
            )
        )
        jsonschema.validate(json.loads(response.text), schema)
        assert response.finish_reason == pb.FINISH_REASON_EOS


def test_a_regex_constrained_output_fully_matches_also_when_streamed(stub) -> None:
    pattern = "[0-9]{3}-[a-z]{2,8}"
    for seed in range(3):
        request = pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=[1]),
            max_new_tokens=100,
            temperature=1.0,
            seed=seed,
            structured_output=pb.StructuredOutput(regex=pattern),
        )
        response = stub.Generate(request)
        assert re.fullmatch(pattern, response.text), response.text
        assert response.finish_reason == pb.FINISH_REASON_EOS
        streamed = list(stub.GenerateStream(request))
        assert "".join(p.text for p in streamed) == response.text


def test_a_lark_grammar_and_json_object_constrain_greedy_output(stub) -> None:
    response = stub.Generate(
        pb.GenerateRequest(
            prompt="Once upon a time",
            max_new_tokens=50,
            structured_output=pb.StructuredOutput(grammar='start: "Lily" | "Tom" | "Ben"'),
        )
    )
    assert response.text in ("Lily", "Tom", "Ben")
    assert response.finish_reason == pb.FINISH_REASON_EOS
    response = stub.Generate(
        pb.GenerateRequest(
            prompt="Once upon a time",
            max_new_tokens=300,
            structured_output=pb.StructuredOutput(json_object=True),
        )
    )
    # Greedy stories260K writes one long string value: an unbounded schema ends at
    # max_new_tokens with a prefix of a valid object (what docs/structured-output.md promises
    # for LENGTH).
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert response.text.startswith('{" a little girl named Lily.')


def test_the_docs_json_schema_example_gives_the_answer_they_show(stub) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "structured-output.md").read_text()
    schema = re.search(r"--json-schema '([^']+)'", doc).group(1)
    body = json.loads(re.search(r"grpcurl -plaintext -d '([^']+)'", doc).group(1))
    assert body["structured_output"]["json_schema"] == schema  # grpcurl and the CLI send one
    answer = re.search(r"^```\n(\{.*\})\n```$", doc, re.M).group(1)
    assert json.loads(schema)["additionalProperties"] is False
    response = stub.Generate(
        pb.GenerateRequest(
            prompt=body["prompt"],
            max_new_tokens=body["max_new_tokens"],
            structured_output=pb.StructuredOutput(json_schema=schema),
        )
    )
    assert response.text == answer
    assert response.finish_reason == pb.FINISH_REASON_EOS
    assert response.usage.completion_tokens == 16
    jsonschema.validate(json.loads(response.text), json.loads(schema))


def test_an_invalid_schema_is_invalid_argument_and_the_server_keeps_serving(stub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(
            pb.GenerateRequest(
                prompt="Once",
                structured_output=pb.StructuredOutput(json_schema='{"type": "foo"}'),
            )
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("structured_output.json_schema: ")
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(
            pb.GenerateRequest(prompt="Once", structured_output=pb.StructuredOutput(regex="(a"))
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("structured_output.regex: ")
    # Valid Lark, but token id 9999 is past this vocabulary: only the scheduler's matcher knows.
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(
            pb.GenerateRequest(
                prompt="Once", structured_output=pb.StructuredOutput(grammar='start: <[9999]> "a"')
            )
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("structured_output.grammar: ")
    response = stub.Generate(pb.GenerateRequest(prompt="Once upon a time", max_new_tokens=5))
    assert response.usage.completion_tokens == 5
