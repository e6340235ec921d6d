"""Reading a KServe ModelInferRequest into generation terms: every numeric conversion of request
``parameters`` and the ``sampling_parameters`` JSON is range-checked, each refusal an
InvalidArgument naming the full field (never another exception, which would be INTERNAL); the
``id`` is checked as Generate's ``request_id``; input shapes are one request's.
Against a real stack: tests/frontend/kserve/test_kserve.py."""

from __future__ import annotations

import json
import math
import struct

import pytest
from factories import make_infer_request
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import PositionLogprobs, StructuredOutput, TokenLogprob
from zerolayer.frontend.kserve.request import ALIASES, SETTINGS, read_text_request
from zerolayer.frontend.kserve.response import logprobs_json, stream_error_response

NUMERIC = sorted(
    k for k in (*SETTINGS, *ALIASES) if SETTINGS[ALIASES.get(k, k)] in ("uint", "float")
)
"""The numeric settings, by every name a request may give them."""
VALUES = st.one_of(
    st.integers(min_value=-(10**500), max_value=10**500),
    st.sampled_from([2**32 - 1, 2**32, 2**64 - 1, 2**64, -1, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, 3.5e38, -0.0, 0.5, 1.0, 1.5]),
    st.sampled_from(["1e999", "nan", "-inf", "1" * 400, "0x10", "", " 7 ", "1e5"]),
    st.booleans(),
    st.none(),
)
"""JSON values of every kind, many out of any field's range."""


FLOAT_RANGES = {
    "repetition_penalty": (math.ulp(0.0), math.inf),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "min_p": (0.0, 1.0),
}
"""Closed ranges of the penalty settings (repetition_penalty: > 0 and finite)."""


def in_range(name: str, value: object) -> bool:
    canonical = ALIASES.get(name, name)
    if canonical == "temperature":
        return isinstance(value, float) and math.isfinite(value) and value >= 0
    if canonical == "top_p":
        return isinstance(value, float) and 0 < value <= 1
    if canonical in FLOAT_RANGES:
        low, high = FLOAT_RANGES[canonical]
        return isinstance(value, float) and math.isfinite(value) and low <= value <= high
    maximum = 2**64 - 1 if canonical == "seed" else 2**32 - 1
    return isinstance(value, int) and 0 <= value <= maximum


def read_setting(name: str, field: str, request) -> None:
    """Reads ``request``: the setting is either in range, or refused naming ``field``."""
    try:
        params = read_text_request(request, "m").params
    except InvalidArgument as refused:
        assert str(refused).startswith(f"{field}: "), str(refused)
        assert len(str(refused)) < 300  # a huge value is not quoted whole
        return
    renamed = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
    canonical = renamed.get(ALIASES.get(name, name), name)
    value = getattr(params, ALIASES.get(canonical, canonical))
    assert in_range(name, value), (name, value)


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(NUMERIC), value=VALUES)
def test_sampling_parameters_json_values_are_in_range_or_refused_naming_the_field(
    name: str, value: object
) -> None:
    sampling = json.dumps({name: value})  # NaN and Infinity as Python's json writes them
    request = make_infer_request("m", "x", sampling_parameters=sampling)
    read_setting(name, f"sampling_parameters.{name}", request)
    request = make_infer_request("m", "x")
    request.parameters["sampling_parameters"].string_param = sampling
    read_setting(name, f"parameters.sampling_parameters.{name}", request)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(NUMERIC),
    kind=st.sampled_from(["int64_param", "uint64_param", "double_param", "string_param"]),
    value=VALUES,
)
def test_request_parameters_are_in_range_or_refused_naming_the_field(
    name: str, kind: str, value: object
) -> None:
    request = make_infer_request("m", "x")
    try:
        setattr(request.parameters[name], kind, str(value) if kind == "string_param" else value)
    except (TypeError, ValueError, OverflowError):
        return  # the proto field cannot hold it: no client can send it
    read_setting(name, f"parameters.{name}", request)


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"temperature": 10**400}, "sampling_parameters.temperature: must be a finite number"),
        ({"temperature": math.nan}, "sampling_parameters.temperature: must be a finite number"),
        ({"top_p": math.inf}, "sampling_parameters.top_p: must be in (0, 1], got inf"),
        ({"temperature": -1}, "sampling_parameters.temperature: must be a finite number >= 0"),
        ({"seed": 10**400}, "sampling_parameters.seed: must be an integer from 0 to 1844"),
        ({"temperature": 1e39}, "sampling_parameters.temperature: 1e+39 is beyond what a float32"),
        ({"top_p": 1e-50}, "sampling_parameters.top_p: 1e-50 is beyond what a float32 holds"),
    ],
)
def test_out_of_range_numbers_are_refused_naming_the_field(sampling, message) -> None:
    request = make_infer_request("m", "x", sampling_parameters=json.dumps(sampling))
    with pytest.raises(InvalidArgument) as refused:
        read_text_request(request, "m")
    assert str(refused.value).startswith(message)


def test_a_stop_input_that_is_not_utf8_is_refused_as_such() -> None:
    request = make_infer_request("m", "x", stop=["ok"])
    request.raw_input_contents[-1] = b"\x02\x00\x00\x00\xff\xfe"
    with pytest.raises(InvalidArgument, match="^stop: not valid UTF-8$"):
        read_text_request(request, "m")


@pytest.mark.parametrize(
    ("request_id", "message"),
    [
        ("a\nb", "id: contains the control character '\\n' (none are allowed)"),
        ("x\x00", "id: contains the control character '\\x00' (none are allowed)"),
        ("x" * 257, "id: longer than 256 characters"),
        ("x" * (4 << 20), "id: longer than 256 characters"),
    ],
)
def test_an_id_generate_would_refuse_is_refused_and_not_echoed(request_id, message) -> None:
    request = make_infer_request("m", "x")
    request.id = request_id
    with pytest.raises(InvalidArgument) as refused:
        read_text_request(request, "m")
    assert str(refused.value) == message
    assert stream_error_response(request, "INVALID_ARGUMENT: ...").infer_response.id == ""


def test_an_id_generate_would_take_is_taken_and_echoed() -> None:
    request = make_infer_request("m", "x")
    request.id = "é" * 256
    read_text_request(request, "m")
    assert stream_error_response(request, "UNAVAILABLE: ...").infer_response.id == "é" * 256


@pytest.mark.parametrize(
    ("index", "shape"),
    [(0, [-1, -1]), (0, []), (0, [1, 1, 1]), (0, [-1]), (0, [2, 1]), (1, [1, -1])],
)
def test_shapes_other_than_n_or_1_by_n_are_refused_naming_the_input(index, shape) -> None:
    request = make_infer_request("m", "x", stop=["a"])
    request.inputs[index].ClearField("shape")
    request.inputs[index].shape.extend(shape)
    with pytest.raises(InvalidArgument) as refused:
        read_text_request(request, "m")
    name = request.inputs[index].name
    assert str(refused.value) == (
        f"inputs[{index}].shape: {shape} for {name!r}: must be [n] or [1, n] (batch size 1, n >= 0)"
    )


def test_shapes_of_one_request_are_taken_and_echoed() -> None:
    request = make_infer_request("m", "x", stop=["a", "b"])
    request.inputs[0].shape[:] = [1, 1]
    request.inputs[1].shape[:] = [1, 2]
    text_request = read_text_request(request, "m")
    assert (text_request.output_shape, text_request.params.stop) == ((1, 1), ("a", "b"))


def test_vllm_sampling_parameters_map_onto_generate_fields() -> None:
    sampling = {
        "repetition_penalty": 1.25,
        "presence_penalty": -0.5,
        "frequency_penalty": "0.75",
        "min_p": 0.1,
        "min_tokens": 3,
        "stop_token_ids": [7, 9],
        "logit_bias": {"5": -100, "12": 2.5},
        "logprobs": 4,
        "prompt_logprobs": "0",
        "guided_json": {"type": "object"},
    }
    request = make_infer_request("m", "x", sampling_parameters=json.dumps(sampling))
    params = read_text_request(request, "m").params
    assert (
        params.repetition_penalty,
        params.presence_penalty,
        params.frequency_penalty,
        params.min_p,
        params.min_new_tokens,
        params.stop_token_ids,
        params.logit_bias,
        params.logprobs,
        params.prompt_logprobs,
        params.structured_output,
    ) == (
        1.25,
        -0.5,
        0.75,
        0.1,
        3,
        (7, 9),
        ((5, -100.0), (12, 2.5)),
        4,
        0,
        StructuredOutput("json_schema", '{"type": "object"}'),
    )


def test_settings_as_request_parameters_and_inputs() -> None:
    request = make_infer_request("m", "x", guided_regex="[0-9]+", stop_token_ids=["[1, 2]"])
    request.inputs[-1].datatype = "INT32"
    request.inputs[-1].shape[:] = [2]
    request.raw_input_contents[-1] = struct.pack("<2i", 1, 2)
    request.parameters["logit_bias"].string_param = '{"3": 1}'
    params = read_text_request(request, "m").params
    assert params.structured_output == StructuredOutput("regex", "[0-9]+")
    assert (params.stop_token_ids, params.logit_bias) == ((1, 2), ((3, 1.0),))


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"logit_bias": {"x": 1}}, "sampling_parameters.logit_bias: must be a JSON object of"),
        ({"logit_bias": [1]}, "sampling_parameters.logit_bias: must be a JSON object of"),
        ({"logit_bias": {"1": True}}, "sampling_parameters.logit_bias: must be a JSON object"),
        ({"stop_token_ids": [1, -2]}, "sampling_parameters.stop_token_ids: must be an integer"),
        ({"stop_token_ids": [2**32]}, "sampling_parameters.stop_token_ids[0]: must be an int"),
        ({"repetition_penalty": 0}, "sampling_parameters.repetition_penalty: must be in (0, inf]"),
        ({"presence_penalty": 2.5}, "sampling_parameters.presence_penalty: must be in [-2, 2]"),
        ({"min_p": -0.1}, "sampling_parameters.min_p: must be in [0, 1], got -0.1"),
        ({"guided_regex": 5}, "sampling_parameters.guided_regex: must be a string"),
        ({"guided_json": "{"}, "sampling_parameters.guided_json: must be JSON"),
        ({"guided_json": {}, "guided_regex": "a"}, "guided_regex: only one of guided_json, guid"),
    ],
)
def test_new_settings_out_of_kind_or_range_are_refused_naming_the_field(sampling, message) -> None:
    request = make_infer_request("m", "x", sampling_parameters=json.dumps(sampling))
    with pytest.raises(InvalidArgument) as refused:
        read_text_request(request, "m")
    assert str(refused.value).startswith(message)


def test_logprobs_output_is_a_json_array_per_position() -> None:
    top = (TokenLogprob(3, -0.25, "a"), TokenLogprob(4, -1.5, "b"))
    raw = logprobs_json([PositionLogprobs(TokenLogprob(4, -1.5, "b"), 2, top)])
    assert json.loads(raw) == [
        {
            "token_id": 4,
            "token": "b",
            "logprob": -1.5,
            "rank": 2,
            "top_logprobs": [
                {"token_id": 3, "token": "a", "logprob": -0.25},
                {"token_id": 4, "token": "b", "logprob": -1.5},
            ],
        }
    ]
