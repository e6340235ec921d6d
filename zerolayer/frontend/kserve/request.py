"""A KServe v2 ``ModelInferRequest`` read into generation terms: the prompt from ``text_input`` and
the sampling settings from request ``parameters``, the ``sampling_parameters`` JSON input and the
scalar inputs (later overriding earlier), with the names Triton's LLM backends use.
See :mod:`zerolayer.frontend.kserve.server` for the tensor names and precedence.
"""

from __future__ import annotations

import functools
import json
import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import GenerateParams, StructuredOutput
from zerolayer.frontend.kserve.tensors import Tensor, check_dtype, read_tensors
from zerolayer.frontend.text.validation import (
    MAX_UINT32,
    MAX_UINT64,
    check_float32,
    check_float_range,
    check_request_id,
    check_temperature,
    check_top_p,
    check_uint,
)
from zerolayer.kserve.v2 import grpc_service_pb2 as pb

SETTINGS = {
    "max_tokens": "uint",
    "temperature": "float",
    "top_p": "float",
    "top_k": "uint",
    "seed": "uint",
    "stop": "strings",
    "ignore_eos": "bool",
    "stream": "bool",
    "exclude_input_in_output": "bool",
    # vLLM's SamplingParams names (Triton's vLLM backend passes them through)
    "repetition_penalty": "float",
    "presence_penalty": "float",
    "frequency_penalty": "float",
    "min_p": "float",
    "min_tokens": "uint",
    "stop_token_ids": "uints",
    "logit_bias": "bias",
    "logprobs": "uint",
    "prompt_logprobs": "uint",
    "guided_json": "json",
    "guided_regex": "string",
    "guided_grammar": "string",
}
"""Settings a request may give, by kind; ``ALIASES`` maps TensorRT-LLM's names onto them."""
ALIASES = {"random_seed": "seed", "stop_words": "stop"}
MAX_VALUES = {
    "max_tokens": MAX_UINT32,
    "top_k": MAX_UINT32,
    "seed": MAX_UINT64,
    "min_tokens": MAX_UINT32,
    "logprobs": MAX_UINT32,
    "prompt_logprobs": MAX_UINT32,
}
"""Largest value of each integer setting: what its GenerateRequest field holds (Generate's
validation narrows some, e.g. logprobs to 20)."""
FLOAT_CHECKS = {
    "temperature": check_temperature,
    "top_p": check_top_p,
    "repetition_penalty": functools.partial(
        check_float_range, low=0.0, high=math.inf, low_open=True
    ),
    "presence_penalty": functools.partial(check_float_range, low=-2.0, high=2.0),
    "frequency_penalty": functools.partial(check_float_range, low=-2.0, high=2.0),
    "min_p": functools.partial(check_float_range, low=0.0, high=1.0),
}
"""The range check of each float setting (Generate's own), given the full field name."""
STRUCTURED_OUTPUT = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_grammar": "grammar",
}
"""vLLM's guided-decoding settings and the StructuredOutput kind each gives; at most one."""
LOGPROB_OUTPUTS = ("logprobs", "prompt_logprobs")
"""Outputs a request may ask for besides ``text_output``, each sent when its setting is given."""
METADATA_DTYPE = {
    "uint": "INT32",
    "float": "FP32",
    "bool": "BOOL",
    "strings": "BYTES",
    "uints": "INT32",
    "string": "BYTES",
    "json": "BYTES",
    "bias": "BYTES",
}
"""Datatype ModelMetadata lists per kind (any integer type is accepted; seeds are UINT64)."""
ACCEPTED_INPUTS = frozenset(("text_input", "sampling_parameters", *SETTINGS, *ALIASES))
"""Names an input tensor may have."""


@dataclass(frozen=True)
class TextRequest:
    """A ModelInferRequest read into generation terms."""

    params: GenerateParams
    stream: bool
    echo_prompt: bool
    output_shape: tuple[int, ...]

    @property
    def output_prefix(self) -> str:
        """What ``text_output`` starts with before the generated text: the prompt if echoed."""
        return (self.params.prompt or "") if self.echo_prompt else ""


def read_text_request(request: pb.ModelInferRequest, model: str) -> TextRequest:
    """Reads the tensors and settings of a request to ``model``; the caller checks the model name.

    Raises:
        InvalidArgument: an ``id`` Generate would refuse as ``request_id`` (too long, a
            control character); a missing, unknown, mistyped or malformed input or setting, or
            an input of a shape the protocol does not allow (see
            :func:`zerolayer.frontend.kserve.tensors.read_tensors`); the message starts with
            ``id``, the input's (or ``parameters.KEY``'s) name, or ``inputs[i].shape``.
    """
    check_request_id("id", request.id)
    for output in request.outputs:
        if output.name not in ("text_output", *LOGPROB_OUTPUTS):
            raise InvalidArgument(
                "outputs",
                f"{output.name!r} unknown (only 'text_output', 'logprobs', 'prompt_logprobs')",
            )
    settings = _parameter_settings(request.parameters)
    tensors = read_tensors(request, ACCEPTED_INPUTS)
    if "sampling_parameters" in tensors:
        tensor, values = tensors.pop("sampling_parameters")
        check_dtype("sampling_parameters", tensor.datatype, "strings")
        _set_json(settings, _one("sampling_parameters", values), "sampling_parameters")
    text_tensor = tensors.pop("text_input", None)
    if text_tensor is None:
        raise InvalidArgument("text_input", "missing (a BYTES input holding the prompt)")
    for name, (tensor, values) in tensors.items():
        kind = SETTINGS[ALIASES.get(name, name)]
        check_dtype(name, tensor.datatype, kind)
        _set(settings, name, values if kind in ("strings", "uints") else _one(name, values), name)
    return TextRequest(
        params=GenerateParams(
            prompt=_prompt(*text_tensor),
            max_new_tokens=settings.get("max_tokens", 0),
            temperature=settings.get("temperature"),
            top_p=settings.get("top_p"),
            top_k=settings.get("top_k"),
            seed=settings.get("seed"),
            stop=tuple(s for s in settings.get("stop", ()) if s),
            ignore_eos=settings.get("ignore_eos", False),
            model=model,
            repetition_penalty=settings.get("repetition_penalty"),
            presence_penalty=settings.get("presence_penalty"),
            frequency_penalty=settings.get("frequency_penalty"),
            min_p=settings.get("min_p"),
            min_new_tokens=settings.get("min_tokens", 0),
            stop_token_ids=tuple(settings.get("stop_token_ids", ())),
            logit_bias=settings.get("logit_bias", ()),
            logprobs=settings.get("logprobs"),
            prompt_logprobs=settings.get("prompt_logprobs"),
            structured_output=_structured_output(settings),
        ),
        stream=settings.get("stream", False),
        echo_prompt=not settings.get("exclude_input_in_output", True),
        output_shape=tuple(text_tensor[0].shape) if len(text_tensor[0].shape) == 2 else (1,),
    )


def _structured_output(settings: Mapping[str, Any]) -> StructuredOutput | None:
    """The one guided-decoding setting given, as a constraint (None for none).

    Raises:
        InvalidArgument: more than one is given.
    """
    given = [name for name in STRUCTURED_OUTPUT if name in settings]
    if len(given) > 1:
        raise InvalidArgument(given[1], f"only one of {', '.join(given)} may be given")
    if not given:
        return None
    return StructuredOutput(STRUCTURED_OUTPUT[given[0]], settings[given[0]])


def _one(name: str, values: list[Any]) -> Any:
    if len(values) != 1:
        raise InvalidArgument(name, f"expected one element (batch size 1), got {len(values)}")
    return values[0]


def _prompt(tensor: Tensor, values: list[Any]) -> str:
    check_dtype("text_input", tensor.datatype, "strings")
    data = _one("text_input", values)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise InvalidArgument("text_input", "not valid UTF-8") from None
    if not text:
        raise InvalidArgument("text_input", "empty")
    return text


def _parameter_settings(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """Settings from request ``parameters``: the scalar ones, then (overriding them) the
    ``sampling_parameters`` JSON string, as the input of that name would."""
    settings: dict[str, Any] = {}
    for key, param in parameters.items():
        value = getattr(param, param.WhichOneof("parameter_choice") or "string_param")
        if ALIASES.get(key, key) in SETTINGS:  # others (priority, timeout...) are Triton's
            _set(settings, key, value, f"parameters.{key}")
    if "sampling_parameters" in parameters:
        field = "parameters.sampling_parameters"
        param = parameters["sampling_parameters"]
        if param.WhichOneof("parameter_choice") != "string_param":
            raise InvalidArgument(field, "must be a string parameter holding a JSON object")
        _set_json(settings, param.string_param, field)
    return settings


def _set_json(settings: dict[str, Any], data: str | bytes, field: str) -> None:
    """Stores the settings of the vLLM-style JSON object ``data``; errors name ``field``."""
    try:
        values = json.loads(data)
    except RecursionError:
        raise InvalidArgument(field, "not valid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(field, f"not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise InvalidArgument(field, "must be a JSON object")
    for key in values:
        if ALIASES.get(key, key) not in SETTINGS:
            raise InvalidArgument(f"{field}.{key}", "not supported")
    for key, value in values.items():
        _set(settings, key, value, f"{field}.{key}")


def _set(settings: dict[str, Any], key: str, value: Any, field: str) -> None:
    """Stores ``value`` under the canonical name of ``key``, converted to its kind (numbers and
    booleans may arrive as strings, as vLLM backend clients send them) and checked against the
    range of its field.

    Raises:
        InvalidArgument: naming ``field`` (e.g. ``sampling_parameters.temperature``): a value of
            another kind, an integer beyond its proto field, a number that overflows a float or
            is out of its setting's range (NaN included), bytes that are not UTF-8.
    """
    canonical = ALIASES.get(key, key)
    kind = SETTINGS[canonical]
    try:
        converted = _convert(kind, value)
    except UnicodeDecodeError:
        raise InvalidArgument(field, "not valid UTF-8") from None
    # NOTE: deeply nested JSON recurses; an integer too large for a float overflows
    except (TypeError, ValueError, RecursionError, OverflowError):
        expected = {
            "uint": "an integer >= 0",
            "float": "a finite number",
            "bool": "a boolean",
            "uints": "an integer >= 0 or a list of them",
            "string": "a string",
            "json": "JSON (a value, or its text)",
            "bias": "a JSON object of token id -> number",
        }
        reason = expected.get(kind, "a string or a list of strings")
        # NOTE: reprlib bounds the message (a status travels in a size-limited trailer)
        shown = reprlib.repr(value)
        raise InvalidArgument(field, f"must be {reason}, got {shown}") from None
    if canonical in MAX_VALUES:
        check_uint(field, converted, MAX_VALUES[canonical])
    if kind == "uints":
        for i, item in enumerate(converted):
            check_uint(f"{field}[{i}]", item, MAX_UINT32)
    if kind == "float":
        check_float32(field, converted)
    if canonical in FLOAT_CHECKS:
        FLOAT_CHECKS[canonical](field, converted)
    settings[canonical] = converted


def _convert(kind: str, value: Any) -> Any:
    if isinstance(value, bytes) and kind in ("string", "json", "bias"):
        value = value.decode()
    if kind == "bias":
        bias = json.loads(value) if isinstance(value, str) else value
        if not isinstance(bias, dict):
            raise TypeError("not an object")
        pairs = []
        for key, number in bias.items():
            if not str(key).isdigit() or not isinstance(number, (int, float)):
                raise TypeError("not token id -> number")
            if isinstance(number, bool):
                raise TypeError("not token id -> number")
            pairs.append((int(key), float(number)))
        return tuple(sorted(pairs))
    if kind == "string":
        if not isinstance(value, str):
            raise TypeError("not a string")
        return value
    if kind == "json":
        # NOTE: a JSON object (vLLM's guided_json, logit_bias) arrives as an object inside the
        # sampling_parameters JSON and as JSON text elsewhere; either way JSON text is kept.
        if isinstance(value, str):
            json.loads(value)
            return value
        if not isinstance(value, (dict, list, bool)):
            raise TypeError("not JSON")
        return json.dumps(value)
    if kind == "uints":
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, list):
            value = [value]
        return [_convert("uint", v) for v in value]
    if kind == "strings":
        if isinstance(value, str) and value.startswith("["):
            value = json.loads(value)
        if not isinstance(value, (str, bytes, list)):  # list() of a dict would take its keys
            raise TypeError("not a string or a list")
        items = [value] if isinstance(value, (str, bytes)) else value
        if not all(isinstance(s, (str, bytes)) for s in items):
            raise TypeError("not strings")
        return [s.decode() if isinstance(s, bytes) else s for s in items]
    if isinstance(value, str):
        value = value.strip()
        if kind == "bool":
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        value = float(value) if kind == "float" else int(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise TypeError("not a boolean")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("not a number")
    if kind == "float":
        return float(value)
    if isinstance(value, float) and not value.is_integer() or value < 0:
        raise ValueError("not an integer >= 0")
    return int(value)
