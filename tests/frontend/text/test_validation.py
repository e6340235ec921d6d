"""Tests for validate(): every rejected field is named, defaults are filled, prompts tokenized."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from zerolayer.checkpoints.byte_tokenizer import build_byte_level_tokenizer
from zerolayer.common.config import FrontendConfig
from zerolayer.common.errors import InvalidArgument, NotFound
from zerolayer.common.generation import (
    EngineRequest,
    GenerateParams,
    SamplingParams,
    StructuredOutput,
)
from zerolayer.frontend.text.tokenizer import TextTokenizer
from zerolayer.frontend.text.validation import ServedModel, check_fits_context, validate

VOCAB_SIZE = 259
MAX_MODEL_LEN = 16
BOS_TOKEN_ID = 1


def make_tokenizer() -> TextTokenizer:
    """The dummy model's byte tokenizer: id = byte + 3, BOS <s> = 1."""
    config = json.dumps({"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>"})
    return TextTokenizer.from_json(build_byte_level_tokenizer().to_str(), config)


def make_config() -> FrontendConfig:
    return FrontendConfig(listen="x", loader_address="x", scheduler_address="x")


def make_model() -> ServedModel:
    return ServedModel(name="dummy", vocab_size=VOCAB_SIZE, max_model_len=MAX_MODEL_LEN)


def make_params(**fields: object) -> GenerateParams:
    """A valid text request ("hi") with ``fields`` overridden."""
    return dataclasses.replace(GenerateParams(prompt="hi"), **fields)


def run(params: GenerateParams) -> EngineRequest:
    return validate(params, make_model(), make_tokenizer(), make_config())


def assert_invalid(params: GenerateParams, field: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        run(params)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    return info.value


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"prompt": None, "prompt_token_ids": ()}, "prompt_token_ids"),
        ({"prompt": None, "prompt_token_ids": (5, VOCAB_SIZE)}, "prompt_token_ids"),
        ({"prompt": "x" * (MAX_MODEL_LEN - 1)}, "prompt"),  # BOS makes it 16 tokens
        ({"prompt": None, "prompt_token_ids": (5,) * MAX_MODEL_LEN}, "prompt"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_p": -math.inf}, "top_p"),
        ({"stop": ("a",) * 17}, "stop"),
        ({"stop": ("ok", "")}, "stop[1]"),
        ({"stop": ("x" * 1025,)}, "stop[0]"),
        ({"cache_salt": "s" * 257}, "cache_salt"),
        ({"cache_salt": "é" * 129}, "cache_salt"),  # 258 UTF-8 bytes in 129 characters
        ({"request_id": "r" * 257}, "request_id"),
        ({"request_id": "a\nb\x00c"}, "request_id"),
        ({"request_id": "tab\there"}, "request_id"),
        ({"request_id": "del\x7f"}, "request_id"),
        ({"request_id": "c1\x85"}, "request_id"),  # NEXT LINE, a C1 control character
        ({"max_new_tokens": 2**32}, "max_new_tokens"),
        ({"max_new_tokens": 2**40}, "max_new_tokens"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"top_k": 2**32}, "top_k"),
        ({"top_k": -1}, "top_k"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -1}, "seed"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": math.inf}, "repetition_penalty"),
        ({"repetition_penalty": math.nan}, "repetition_penalty"),
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"presence_penalty": math.nan}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"min_p": 1.01}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": math.nan}, "min_p"),
        ({"max_new_tokens": 4, "min_new_tokens": 5}, "min_new_tokens"),
        ({"min_new_tokens": 65}, "min_new_tokens"),  # over the default max_new_tokens, 64
        ({"stop_token_ids": (VOCAB_SIZE,)}, "stop_token_ids"),
        ({"stop_token_ids": tuple(range(65))}, "stop_token_ids"),
        ({"logit_bias": ((VOCAB_SIZE, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((5, 100.5),)}, "logit_bias[5]"),
        ({"logit_bias": ((5, math.nan),)}, "logit_bias[5]"),
        ({"logit_bias": tuple((i % VOCAB_SIZE, 0.0) for i in range(1025))}, "logit_bias"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ],
)
def test_invalid_field_is_named(fields: dict[str, object], field: str) -> None:
    assert_invalid(make_params(**fields), field)


def test_out_of_vocab_id_message_names_index_and_vocab_size() -> None:
    error = assert_invalid(
        make_params(prompt=None, prompt_token_ids=(5, 6, VOCAB_SIZE + 3)), "prompt_token_ids"
    )
    assert str(error) == "prompt_token_ids: id 262 at index 2 is not below vocab_size 259"


def test_prompt_too_long_message_names_lengths() -> None:
    error = assert_invalid(make_params(prompt="x" * 20), "prompt")
    assert str(error) == (
        "prompt: 21 tokens; the model's context length is 16 (prompt must be shorter)"
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt": "x" * (MAX_MODEL_LEN - 2)},
        {"prompt": None, "prompt_token_ids": (0, VOCAB_SIZE - 1)},
        {"stop": ("a",) * 16},
        {"stop": ("x" * 1024,)},
        {"cache_salt": "s" * 256},
        {"request_id": "r" * 256},
        {"request_id": "tenant-é/日本 #7"},
        {"max_new_tokens": 2**32 - 1},
        {"top_k": 2**32 - 1},
        {"seed": 2**64 - 1},
        {"seed": 0},
        {"top_p": 1.0},
        {"top_p": 1e-9},
        {"temperature": 0.0},
        {"model": "dummy"},
        {"model": ""},
        {"repetition_penalty": 1e-3, "presence_penalty": -2.0, "frequency_penalty": 2.0},
        {"min_p": 0.0},
        {"min_p": 1.0},
        {"max_new_tokens": 4, "min_new_tokens": 4},
        {"min_new_tokens": 64},
        {"stop_token_ids": tuple(range(VOCAB_SIZE - 64, VOCAB_SIZE))},
        {"logit_bias": ((0, -100.0), (VOCAB_SIZE - 1, 100.0))},
        {"logprobs": 20, "prompt_logprobs": 0},
    ],
)
def test_values_at_the_limits_are_accepted(fields: dict[str, object]) -> None:
    run(make_params(**fields))


def test_out_of_range_and_control_character_messages() -> None:
    error = assert_invalid(make_params(max_new_tokens=2**40), "max_new_tokens")
    assert (
        str(error) == "max_new_tokens: must be an integer from 0 to 4294967295, got 1099511627776"
    )
    error = assert_invalid(make_params(request_id="a\nb\x00c"), "request_id")
    assert str(error) == "request_id: contains the control character '\\n' (none are allowed)"


def test_unknown_model_is_not_found() -> None:
    with pytest.raises(NotFound) as info:
        run(make_params(model="other"))
    assert str(info.value) == "model: 'other' is not served (serving 'dummy')"


def test_defaults_are_filled_in() -> None:
    request = run(make_params(request_id="r1"))
    assert request == EngineRequest(
        request_id="r1",
        prompt_token_ids=(BOS_TOKEN_ID, ord("h") + 3, ord("i") + 3),
        max_new_tokens=64,
        sampling=SamplingParams(temperature=0.0, top_p=1.0, top_k=0, seed=None),
        ignore_eos=False,
        cache_salt="",
    )
    assert request.sampling.is_greedy


def test_given_values_are_kept() -> None:
    params = make_params(
        max_new_tokens=5,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        seed=123,
        stop=("\n",),
        ignore_eos=True,
        cache_salt="salt",
        request_id="r2",
        model="dummy",
    )
    assert run(params) == EngineRequest(
        request_id="r2",
        prompt_token_ids=(BOS_TOKEN_ID, ord("h") + 3, ord("i") + 3),
        max_new_tokens=5,
        sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=123),
        ignore_eos=True,
        cache_salt="salt",
    )


def test_text_prompt_gets_exactly_one_bos() -> None:
    assert run(make_params(prompt="é!")).prompt_token_ids == (BOS_TOKEN_ID, 0xC3 + 3, 0xA9 + 3, 36)


def test_prompt_token_ids_are_used_as_given_without_bos() -> None:
    request = run(make_params(prompt=None, prompt_token_ids=(5, 0, 258, 5)))
    assert request.prompt_token_ids == (5, 0, 258, 5)


def test_request_id_is_generated_when_empty() -> None:
    first = run(make_params()).request_id
    second = run(make_params()).request_id
    assert len(first) == 32 and int(first, 16) >= 0
    assert first != second


def test_sampling_controls_are_kept() -> None:
    params = make_params(
        request_id="r3",
        max_new_tokens=5,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        min_p=0.1,
        logit_bias=((9, -1.0), (4, 2.0)),
        min_new_tokens=3,
        stop_token_ids=(7, 5, 7),
        logprobs=5,
        prompt_logprobs=0,
    )
    assert run(params) == EngineRequest(
        request_id="r3",
        prompt_token_ids=(BOS_TOKEN_ID, ord("h") + 3, ord("i") + 3),
        max_new_tokens=5,
        sampling=SamplingParams(
            repetition_penalty=1.2,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            min_p=0.1,
            logit_bias=((4, 2.0), (9, -1.0)),
        ),
        min_new_tokens=3,
        stop_token_ids=(7, 5),
        logprobs=5,
        prompt_logprobs=0,
    )


def test_check_fits_context_refuses_an_explicit_max_new_tokens_past_the_context() -> None:
    params = make_params(prompt_token_ids=(5, 6, 7), prompt=None, max_new_tokens=14)
    with pytest.raises(InvalidArgument) as info:
        check_fits_context(params, run(params), make_model())
    assert (info.value.field, info.value.reason) == ("max_new_tokens", "context-length-exceeded")
    assert str(info.value) == (
        "max_new_tokens: this model's maximum context length is 16 tokens; however, you "
        "requested 17 tokens (3 in the prompt, 14 in the completion): shorten the prompt or ask "
        "for fewer tokens"
    )
    fits = make_params(prompt_token_ids=(5, 6, 7), prompt=None, max_new_tokens=13)
    check_fits_context(fits, run(fits), make_model())
    unset = make_params(prompt_token_ids=(5, 6, 7), prompt=None)
    check_fits_context(unset, run(unset), make_model())  # the default is clipped, not refused


@pytest.mark.parametrize(("n", "expected"), [(0, 1), (1, 1), (3, 3), (16, 16)])
def test_n_defaults_to_one_and_greedy_samples_are_allowed(n: int, expected: int) -> None:
    assert run(make_params(n=n)).n == expected  # greedy (temperature 0): identical samples


@pytest.mark.parametrize("n", [17, -1])
def test_n_above_16_is_refused(n: int) -> None:
    error = assert_invalid(make_params(n=n), "n")
    assert str(error) == f"n: must be an integer from 0 to 16, got {n}"


@pytest.mark.parametrize("kind", ["json_schema", "regex", "grammar"])
def test_a_structured_output_over_max_grammar_bytes_is_named(kind: str) -> None:
    limit = make_config().max_grammar_bytes
    assert limit == 128 * 1024
    constraint = StructuredOutput(kind, "a" * (limit + 1))
    error = assert_invalid(make_params(structured_output=constraint), f"structured_output.{kind}")
    assert str(error).endswith(f"{limit + 1} bytes; at most {limit} (--max-grammar-bytes)")


def test_validation_leaves_the_compile_of_a_constraint_to_the_caller() -> None:
    constraint = StructuredOutput("grammar", "start: missing")  # refused by grammar_of
    assert run(make_params(structured_output=constraint)).structured_output == constraint


def test_a_valid_structured_output_reaches_the_engine_request() -> None:
    constraint = StructuredOutput("regex", "[0-9]{3}")
    assert run(make_params(structured_output=constraint)).structured_output == constraint
    assert run(make_params()).structured_output is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 1e39),
        ("temperature", 1e308),
        ("top_p", 1e-50),
        ("repetition_penalty", 3.5e39),
        ("repetition_penalty", 1e-50),
        ("presence_penalty", -1e-60),
    ],
)
def test_numbers_a_float32_cannot_hold_are_refused(field: str, value: float) -> None:
    # JSON (HTTP, KServe) carries float64: 1e39 became inf and 1e-50 became 0 in the engine.
    error = assert_invalid(make_params(**{field: value}), field)
    assert "beyond what a float32 holds" in str(error)


def test_a_logit_bias_a_float32_cannot_hold_is_refused() -> None:
    assert_invalid(make_params(logit_bias=((5, 1e-45 / 10),)), "logit_bias[5]")


def test_float32_extremes_are_taken() -> None:
    run(make_params(temperature=3.4e38, top_p=1e-38, repetition_penalty=1e-38))
