"""Validation of the sampling controls of a Generate request: penalties, min_p, logit_bias,
min_new_tokens, stop_token_ids, logprobs and prompt_logprobs.

Every rejection is an :class:`InvalidArgument` naming the field. The ranges are the ones the
public proto documents (``protos/zerolayer/v1/generation.proto``).
"""

from __future__ import annotations

import math
from dataclasses import replace

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import EngineRequest, GenerateParams, SamplingParams

MAX_ABS_PENALTY = 2.0
"""presence_penalty and frequency_penalty lie in [-2, 2] (OpenAI's range)."""
MAX_N = 16
"""Most samples of a request (n)."""
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_ABS_LOGIT_BIAS = 100.0
MAX_LOGPROBS = 20
"""Most alternatives per position of logprobs and prompt_logprobs."""


def with_sampling_controls(
    sampling: SamplingParams, params: GenerateParams, vocab_size: int
) -> SamplingParams:
    """``sampling`` with the checked controls of ``params`` (unset ones at their "off" value).

    Raises:
        InvalidArgument: repetition_penalty not finite and > 0; presence_penalty or
            frequency_penalty outside [-2, 2]; min_p outside [0, 1]; logit_bias with more than
            1024 entries, an id not below ``vocab_size`` or a value outside [-100, 100].
    """
    repetition = 1.0 if params.repetition_penalty is None else params.repetition_penalty
    if not (math.isfinite(repetition) and repetition > 0):
        raise InvalidArgument(
            "repetition_penalty", f"must be a finite number > 0, got {repetition}"
        )
    presence = _in_range("presence_penalty", params.presence_penalty, MAX_ABS_PENALTY)
    frequency = _in_range("frequency_penalty", params.frequency_penalty, MAX_ABS_PENALTY)
    min_p = 0.0 if params.min_p is None else params.min_p
    if not (math.isfinite(min_p) and 0 <= min_p <= 1):
        raise InvalidArgument("min_p", f"must be in [0, 1], got {min_p}")
    if len(params.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise InvalidArgument(
            "logit_bias", f"{len(params.logit_bias)} entries; at most {MAX_LOGIT_BIAS_ENTRIES}"
        )
    for token_id, value in params.logit_bias:
        _check_id("logit_bias", token_id, vocab_size)
        _in_range(f"logit_bias[{token_id}]", value, MAX_ABS_LOGIT_BIAS)
    return replace(
        sampling,
        repetition_penalty=repetition,
        presence_penalty=presence,
        frequency_penalty=frequency,
        min_p=min_p,
        logit_bias=tuple(sorted(params.logit_bias)),
    )


def with_request_controls(
    request: EngineRequest, params: GenerateParams, vocab_size: int
) -> EngineRequest:
    """``request`` with the checked controls of ``params`` that belong to the engine request
    (``min_new_tokens`` is checked against ``request.max_new_tokens``, the default applied).

    Raises:
        InvalidArgument: min_new_tokens above ``max_new_tokens``; more than 64 stop_token_ids or
            one not below ``vocab_size``; logprobs or prompt_logprobs above 20.
    """
    if params.min_new_tokens > request.max_new_tokens:
        raise InvalidArgument(
            "min_new_tokens",
            f"{params.min_new_tokens} is more than max_new_tokens ({request.max_new_tokens})",
        )
    if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidArgument(
            "stop_token_ids", f"{len(params.stop_token_ids)} ids; at most {MAX_STOP_TOKEN_IDS}"
        )
    for token_id in params.stop_token_ids:
        _check_id("stop_token_ids", token_id, vocab_size)
    for field in ("logprobs", "prompt_logprobs"):
        value = getattr(params, field)
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise InvalidArgument(field, f"must be 0 to {MAX_LOGPROBS}, got {value}")
    return replace(
        request,
        min_new_tokens=params.min_new_tokens,
        stop_token_ids=tuple(dict.fromkeys(params.stop_token_ids)),
        logprobs=params.logprobs,
        prompt_logprobs=params.prompt_logprobs,
    )


def _in_range(field: str, value: float | None, bound: float) -> float:
    value = 0.0 if value is None else value
    if not (math.isfinite(value) and -bound <= value <= bound):
        raise InvalidArgument(field, f"must be in [{-bound:g}, {bound:g}], got {value}")
    return value


def _check_id(field: str, token_id: int, vocab_size: int) -> None:
    if not 0 <= token_id < vocab_size:
        raise InvalidArgument(field, f"id {token_id} is not below vocab_size {vocab_size}")
