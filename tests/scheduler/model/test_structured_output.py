"""Tests for the scheduler's structured-output matchers, on stories260K's real tokenizer (512
tokens: specials, 256 byte-fallback pieces <0x00>..<0xFF> at ids 3..258, then merges)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from zerolayer.checkpoints.default_model import write_default_model
from zerolayer.common.errors import InvalidArgument, ZerolayerError
from zerolayer.common.generation import SamplingParams, StructuredOutput
from zerolayer.common.structured_output import grammar_of
from zerolayer.scheduler.model.sampler import Sampler
from zerolayer.scheduler.model.structured_output import (
    GrammarBackend,
    GrammarMatcher,
    allowed_tokens,
)

VOCAB_SIZE = 512
EOS_TOKEN_IDS = (2, 1)
BYTE_OFFSET = 3
"""Id of the byte piece <0x00>; byte b is id 3 + b."""


def byte_id(char: str) -> int:
    return BYTE_OFFSET + ord(char)


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    model_dir = write_default_model(tmp_path_factory.mktemp("stories260K"))
    return (Path(model_dir) / "tokenizer.json").read_text()


@pytest.fixture(scope="module")
def backend(tokenizer_json: str):
    backend = GrammarBackend(tokenizer_json, VOCAB_SIZE, EOS_TOKEN_IDS)
    yield backend
    backend.close()


def vocab_ids(tokenizer_json: str, pieces: str) -> list[int]:
    """Ids of the merged (non-byte) pieces among ``pieces``, from tokenizer.json's vocab."""
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    return [vocab[p] for p in pieces if p in vocab]


def matcher_of(backend: GrammarBackend, constraint: StructuredOutput) -> GrammarMatcher:
    """A request's matcher: ``constraint`` compiled (waited for), then copied."""
    return backend.matcher(backend.compile(constraint).result())


def piece_bytes(backend: GrammarBackend, token_id: int) -> bytes:
    return backend.tokenizer().decode_bytes([token_id])


def test_the_first_mask_of_a_regex_allows_exactly_the_digit_pieces(
    backend, tokenizer_json: str
) -> None:
    matcher = matcher_of(backend, StructuredOutput("regex", "[0-9]{3}-[a-z]+"))
    mask = matcher.allowed()
    assert mask is not None and mask.shape == (VOCAB_SIZE,)
    # The byte pieces <0x30>..<0x39> and the single-digit pieces "0".."9" (no longer digit run
    # is a piece of this vocabulary).
    digits = [byte_id(c) for c in "0123456789"] + vocab_ids(tokenizer_json, "0123456789")
    assert np.flatnonzero(mask).tolist() == sorted(digits)


def test_the_mask_follows_the_consumed_tokens_and_allows_eos_once_complete(
    backend, tokenizer_json: str
) -> None:
    matcher = matcher_of(backend, StructuredOutput("regex", "[0-9]{3}-[a-z]+"))
    for char in "123":
        matcher.allowed()
        matcher.accept(byte_id(char))
    allowed_ids = np.flatnonzero(matcher.allowed()).tolist()
    assert vocab_ids(tokenizer_json, "-")[0] in allowed_ids
    assert {piece_bytes(backend, i) for i in allowed_ids} == {b"-"}
    matcher.accept(byte_id("-"))
    mask = matcher.allowed()
    assert not mask[list(EOS_TOKEN_IDS)].any()  # at least one letter first
    allowed_bytes = {piece_bytes(backend, int(i)) for i in np.flatnonzero(mask)}
    assert all(b.isalpha() and b.islower() for b in allowed_bytes)
    assert {c.encode() for c in "abcxyz"} <= allowed_bytes
    matcher.accept(byte_id("a"))
    mask = matcher.allowed()
    assert mask[list(EOS_TOKEN_IDS)].all()
    assert not matcher.is_done
    matcher.accept(EOS_TOKEN_IDS[0])
    assert matcher.is_done and matcher.error is None


def test_a_grammar_that_allows_nothing_more_is_done_without_eos(backend) -> None:
    matcher = matcher_of(backend, StructuredOutput("regex", "ab"))
    matcher.allowed()
    matcher.accept(byte_id("a"))
    matcher.allowed()
    matcher.accept(byte_id("b"))
    assert matcher.is_done and matcher.error is None


def test_a_token_outside_the_mask_fails_the_matcher(backend) -> None:
    matcher = matcher_of(backend, StructuredOutput("regex", "[0-9]+"))
    matcher.allowed()
    matcher.accept(byte_id("x"))
    assert matcher.is_done
    assert type(matcher.error) is ZerolayerError
    assert str(matcher.error).startswith("structured output: ")


def test_allowed_tokens_stacks_the_constrained_rows_and_leaves_the_others_free(
    backend, tokenizer_json: str
) -> None:
    matcher = matcher_of(backend, StructuredOutput("regex", "7"))
    assert allowed_tokens([None, None], VOCAB_SIZE) is None
    allowed = allowed_tokens([None, matcher], VOCAB_SIZE)
    assert allowed is not None and allowed.dtype == torch.bool
    assert allowed.shape == (2, VOCAB_SIZE)
    assert bool(allowed[0].all())
    # NOTE: llguidance drops the byte piece <0x37> where the piece "7" spells the same text.
    assert torch.nonzero(allowed[1]).flatten().tolist() == vocab_ids(tokenizer_json, "7")


def test_the_sampler_draws_only_allowed_tokens_greedy_and_sampled() -> None:
    logits = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    allowed = torch.zeros(3, 8, dtype=torch.bool)
    allowed[0, 5] = True
    allowed[1, [2, 6]] = True
    allowed[2] = True
    params = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams()]
    for seed in range(20):
        token_ids = Sampler()(logits, params, [seed] * 3, [0, 0, 0], allowed=allowed)
        assert token_ids[0] == 5
        assert token_ids[1] in (2, 6)
        assert token_ids[2] == int(logits[2].argmax())


@pytest.mark.parametrize(
    ("constraint", "field", "message"),
    [
        (StructuredOutput("json_schema", "{not json"), "structured_output.json_schema", "not JSON"),
        (StructuredOutput("json_schema", "[1]"), "structured_output.json_schema", "object"),
        (
            StructuredOutput("json_schema", json.dumps({"type": "foo"})),
            "structured_output.json_schema",
            "foo",
        ),
        (StructuredOutput("regex", "[0-9]{3"), "structured_output.regex", "unclosed"),
        (StructuredOutput("grammar", "start: undefined_rule"), "structured_output.grammar", ""),
    ],
)
def test_an_invalid_constraint_is_invalid_argument_naming_the_field(
    constraint: StructuredOutput, field: str, message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        grammar_of(constraint)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert message in str(info.value)


def test_valid_constraints_compile(backend) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for constraint in (
        StructuredOutput("json_schema", json.dumps(schema)),
        StructuredOutput("json_object"),
        StructuredOutput("regex", "[a-z]+"),
        StructuredOutput("grammar", 'start: "yes" | "no"'),
    ):
        matcher = matcher_of(backend, constraint)
        assert matcher.allowed() is not None and matcher.error is None


def test_a_grammar_this_tokenizer_cannot_serve_fails_to_compile_as_invalid_argument(
    backend,
) -> None:
    # Valid without a tokenizer (what the frontend checks), but id 9999 is past this vocabulary.
    constraint = StructuredOutput("grammar", 'start: <[9999]> "a"')
    grammar_of(constraint)
    with pytest.raises(InvalidArgument) as info:
        backend.compile(constraint).result()
    assert info.value.field == "structured_output.grammar"
    assert "9999" in str(info.value)
