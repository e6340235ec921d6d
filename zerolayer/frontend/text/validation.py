"""Validation of public Generate requests into engine requests.

Every rejection is an :class:`InvalidArgument` (or NotFound for the model name) whose message
starts with the offending field's name.
"""

from __future__ import annotations

import math
import reprlib
import struct
import unicodedata
import uuid
from dataclasses import dataclass

from zerolayer.common.config import FrontendConfig
from zerolayer.common.errors import InvalidArgument, NotFound
from zerolayer.common.generation import EngineRequest, GenerateParams, SamplingParams
from zerolayer.common.structured_output import check_size
from zerolayer.frontend.text.chat_template import ChatTemplate, check_messages
from zerolayer.frontend.text.chat_variables import template_kwargs
from zerolayer.frontend.text.sampling_controls import (
    MAX_N,
    with_request_controls,
    with_sampling_controls,
)
from zerolayer.frontend.text.tokenizer import TextTokenizer

MAX_REQUEST_ID_CHARS = 256
MAX_PROMPT_CHARS_PER_TOKEN = 64
"""A text prompt longer than max_model_len * this many characters cannot fit the context with any
usual tokenizer; it is refused before tokenizing (which would cost seconds and memory)."""
MAX_STOP_STRING_CHARS = 1024
MAX_UINT32 = 2**32 - 1
"""Largest max_new_tokens and top_k (uint32 fields of GenerateRequest and EngineRequest)."""
MAX_UINT64 = 2**64 - 1
"""Largest seed (a uint64 field)."""


@dataclass(frozen=True)
class ServedModel:
    """What validation needs to know about the served model."""

    name: str
    vocab_size: int
    max_model_len: int


def validate(
    params: GenerateParams,
    model: ServedModel,
    tokenizer: TextTokenizer,
    config: FrontendConfig,
    chat_template: ChatTemplate | None = None,
) -> EngineRequest:
    """Checks every field and tokenizes the prompt.

    Args:
        chat_template: the model's, for ``messages``; None: it has none.

    Returns:
        The engine request: prompt token ids (text prompts tokenized with BOS per the model's
        tokenizer config; token-id prompts exactly as given; messages rendered with the chat
        template, then tokenized without adding BOS), sampling parameters with defaults
        (temperature 0 = greedy, top_p 1, top_k off), max_new_tokens (0 -> the default).

    Raises:
        NotFound: ``model`` names another model.
        InvalidArgument: any field out of range; the message names the field. A
            structured-output constraint is only checked for size here: its compile is the
            caller's (``zerolayer.common.structured_output.grammar_of``, seconds for a large
            one), on a thread where it delays nobody else.
    """
    check_model(params.model, model)
    prompt_token_ids = _prompt_token_ids(params, model, tokenizer, chat_template)
    if len(prompt_token_ids) >= model.max_model_len:
        raise InvalidArgument(
            "messages" if params.messages is not None else "prompt",
            f"{len(prompt_token_ids)} tokens; the model's context "
            f"length is {model.max_model_len} (prompt must be shorter)",
        )
    check_uint("max_new_tokens", params.max_new_tokens, MAX_UINT32)
    check_uint("n", params.n, MAX_N)
    for field in FLOAT32_FIELDS:
        check_float32(field, getattr(params, field))
    for token_id, bias in params.logit_bias:
        check_float32(f"logit_bias[{token_id}]", bias)
    sampling = with_sampling_controls(_sampling(params), params, model.vocab_size)
    _check_strings(params, config)
    if params.structured_output is not None:
        check_size(params.structured_output, config.max_grammar_bytes)
    request = EngineRequest(
        request_id=params.request_id or uuid.uuid4().hex,
        prompt_token_ids=tuple(prompt_token_ids),
        max_new_tokens=params.max_new_tokens or config.default_max_new_tokens,
        sampling=sampling,
        ignore_eos=params.ignore_eos,
        cache_salt=params.cache_salt,
        n=params.n or 1,
        structured_output=params.structured_output,
    )
    return with_request_controls(request, params, model.vocab_size)


def _prompt_token_ids(
    params: GenerateParams,
    model: ServedModel,
    tokenizer: TextTokenizer,
    chat_template: ChatTemplate | None,
) -> list[int]:
    if params.messages is not None:
        return _chat_token_ids(params, model, tokenizer, chat_template)
    if params.prompt_token_ids is not None:
        if not params.prompt_token_ids:
            raise InvalidArgument("prompt_token_ids", "empty")
        for i, token_id in enumerate(params.prompt_token_ids):
            if token_id < 0:
                raise InvalidArgument("prompt_token_ids", f"id {token_id} at index {i} is negative")
            if token_id >= model.vocab_size:
                raise InvalidArgument(
                    "prompt_token_ids",
                    f"id {token_id} at index {i} is not below vocab_size {model.vocab_size}",
                )
        return list(params.prompt_token_ids)
    if not params.prompt:
        raise InvalidArgument("prompt", "empty (set prompt or prompt_token_ids)")
    check_text_length("prompt", params.prompt, model)
    token_ids = tokenizer.encode(params.prompt, add_special_tokens=True)
    if not token_ids:
        raise InvalidArgument("prompt", "tokenizes to no tokens")
    return token_ids


def _chat_token_ids(
    params: GenerateParams,
    model: ServedModel,
    tokenizer: TextTokenizer,
    chat_template: ChatTemplate | None,
) -> list[int]:
    check_messages(params.messages or ())
    if chat_template is None:
        raise InvalidArgument(
            "messages", "the model has no chat template (send prompt or prompt_token_ids)"
        )
    text = chat_template.render(
        params.messages or (),
        params.add_generation_prompt is not False,
        params.tools,
        template_kwargs(params.chat_template_kwargs_json),
    )
    check_text_length("messages", text, model)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # e.g. "\\ud800" in a call's JSON arguments, decoded by the template
        raise InvalidArgument(
            "messages", "renders to text that is not Unicode (a lone surrogate)"
        ) from None
    # NOTE: the template writes BOS itself (transformers' apply_chat_template does the same)
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    if not token_ids:
        raise InvalidArgument("messages", "the chat template renders no tokens")
    return token_ids


def check_model(name: str, model: ServedModel) -> None:
    """Refuses a model name other than the served one ("": the served one).

    Raises:
        NotFound: naming ``model``, the name asked for and the one served; its ``reason`` is
            ``model-not-found`` (OpenAI's ``model_not_found``).
    """
    if name and name != model.name:
        error = NotFound(f"model: {name!r} is not served (serving {model.name!r})")
        error.reason = "model-not-found"
        raise error


def check_fits_context(params: GenerateParams, request: EngineRequest, model: ServedModel) -> None:
    """Refuses an explicit ``max_new_tokens`` that, after the prompt, goes past the context
    (OpenAI's semantics; otherwise the scheduler stops at the context's end, FinishReason.LENGTH).

    Raises:
        InvalidArgument: naming ``max_new_tokens``, the context length and both token counts;
            its ``reason`` is ``context-length-exceeded``.
    """
    num_prompt_tokens = len(request.prompt_token_ids)
    total = num_prompt_tokens + params.max_new_tokens
    if params.max_new_tokens and total > model.max_model_len:
        error = InvalidArgument(
            "max_new_tokens",
            f"this model's maximum context length is {model.max_model_len} tokens; however, "
            f"you requested {total} tokens ({num_prompt_tokens} in the prompt, "
            f"{params.max_new_tokens} in the completion): shorten the prompt or ask for fewer "
            "tokens",
        )
        error.reason = "context-length-exceeded"
        raise error


def check_text_length(field: str, text: str, model: ServedModel) -> None:
    """Refuses text far longer than the context could hold, before tokenizing it.

    Raises:
        InvalidArgument: more than max_model_len * MAX_PROMPT_CHARS_PER_TOKEN characters.
    """
    limit = model.max_model_len * MAX_PROMPT_CHARS_PER_TOKEN
    if len(text) > limit:
        raise InvalidArgument(
            field,
            f"{len(text)} characters; at most {limit} (the model's "
            f"context is {model.max_model_len} tokens)",
        )


def check_uint(field: str, value: int | None, maximum: int) -> None:
    """Refuses an integer outside 0..``maximum`` (None: unset, accepted).

    Raises:
        InvalidArgument: naming ``field``.
    """
    if value is not None and not 0 <= value <= maximum:
        # NOTE: reprlib bounds a huge value (a status travels in a size-limited trailer)
        raise InvalidArgument(
            field, f"must be an integer from 0 to {maximum}, got {reprlib.repr(value)}"
        )


def _check_strings(params: GenerateParams, config: FrontendConfig) -> None:
    if len(params.stop) > config.max_stop_strings:
        raise InvalidArgument(
            "stop", f"{len(params.stop)} strings; at most {config.max_stop_strings}"
        )
    for i, stop in enumerate(params.stop):
        if not stop or len(stop) > MAX_STOP_STRING_CHARS:
            raise InvalidArgument(f"stop[{i}]", f"must be 1 to {MAX_STOP_STRING_CHARS} characters")
    if len(params.cache_salt.encode()) > config.max_cache_salt_bytes:
        raise InvalidArgument("cache_salt", f"longer than {config.max_cache_salt_bytes} bytes")
    check_request_id("request_id", params.request_id)


def check_request_id(field: str, request_id: str) -> None:
    """Refuses a client's request id (Generate's ``request_id``, KServe's ``id``) of more than
    :data:`MAX_REQUEST_ID_CHARS` characters or with a control character (Unicode category Cc).

    Raises:
        InvalidArgument: naming ``field``.
    """
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_REQUEST_ID_CHARS} characters")
    # NOTE: the id is echoed and written to logs and traces, where a newline or NUL could forge
    # or cut a line.
    control = next((c for c in request_id if unicodedata.category(c) == "Cc"), None)
    if control is not None:
        raise InvalidArgument(
            field, f"contains the control character {control!r} (none are allowed)"
        )


def check_temperature(field: str, value: float) -> None:
    """Refuses a temperature that is not a finite number >= 0 (NaN included).

    Raises:
        InvalidArgument: naming ``field``.
    """
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(field, f"must be a finite number >= 0, got {value}")


def check_top_p(field: str, value: float) -> None:
    """Refuses a top_p outside (0, 1] (NaN included).

    Raises:
        InvalidArgument: naming ``field``.
    """
    if not (math.isfinite(value) and 0 < value <= 1):
        raise InvalidArgument(field, f"must be in (0, 1], got {value}")


FLOAT32_FIELDS = (
    "temperature",
    "top_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_p",
)
"""GenerateParams fields the engine holds as float32 (they are float fields of the protos)."""
FLOAT32_MAX = 3.4028234663852886e38


def check_float32(field: str, value: float | None) -> None:
    """Refuses a finite number a float32 cannot hold: beyond +-3.40282e38, or so close to 0
    that it rounds to 0 (a top_p of 1e-50 would become 0, a repetition_penalty a division by
    0). The HTTP and KServe APIs read JSON numbers as float64, so they can send such values;
    gRPC's float fields cannot. None (unset), NaN and infinities are left to the range checks.

    Raises:
        InvalidArgument: naming ``field``.
    """
    if value is None or not math.isfinite(value):
        return
    if abs(value) > FLOAT32_MAX or (
        value != 0 and struct.unpack("f", struct.pack("f", value))[0] == 0
    ):
        raise InvalidArgument(
            field, f"{value!r} is beyond what a float32 holds (magnitude 1.2e-38 to 3.4e38, or 0)"
        )


def check_float_range(
    field: str, value: float, low: float, high: float, *, low_open: bool = False
) -> None:
    """Refuses a number outside [low, high] ((low, high] when ``low_open``), NaN included.

    Raises:
        InvalidArgument: naming ``field``.
    """
    above = value > low if low_open else value >= low
    if not (math.isfinite(value) and above and value <= high):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise InvalidArgument(field, f"must be in {interval}, got {value}")


def _sampling(params: GenerateParams) -> SamplingParams:
    temperature = 0.0 if params.temperature is None else params.temperature
    check_temperature("temperature", temperature)
    top_p = 1.0 if params.top_p is None else params.top_p
    check_top_p("top_p", top_p)
    check_uint("top_k", params.top_k, MAX_UINT32)
    check_uint("seed", params.seed, MAX_UINT64)
    return SamplingParams(
        temperature=temperature, top_p=top_p, top_k=params.top_k or 0, seed=params.seed
    )
