"""Conversion of the scheduler's messages (``zerolayer.v1.Scheduler``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from zerolayer.common.convert.generation import (
    structured_output_from_pb,
    structured_output_to_pb,
)
from zerolayer.common.generation import (
    EngineRequest,
    FinishReason,
    PositionLogprobs,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from zerolayer.common.scheduler_role import SchedulerRole
from zerolayer.v1 import scheduler_pb2


def engine_request_to_pb(r: EngineRequest) -> scheduler_pb2.EngineRequest:
    """Domain request to the scheduler's wire form."""
    s = r.sampling
    return scheduler_pb2.EngineRequest(
        request_id=r.request_id,
        prompt_token_ids=r.prompt_token_ids,
        max_new_tokens=r.max_new_tokens,
        ignore_eos=r.ignore_eos,
        cache_salt=r.cache_salt,
        sampling=scheduler_pb2.SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            seed=s.seed,
            repetition_penalty=s.repetition_penalty,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            min_p=s.min_p,
            logit_bias=dict(s.logit_bias),
        ),
        min_new_tokens=r.min_new_tokens,
        stop_token_ids=r.stop_token_ids,
        logprobs=r.logprobs,
        prompt_logprobs=r.prompt_logprobs,
        n=r.n,
        structured_output=structured_output_to_pb(r.structured_output),
        num_resumed_output_tokens=r.num_resumed_output_tokens,
    )


def engine_request_from_pb(pb: scheduler_pb2.EngineRequest) -> EngineRequest:
    """Wire request to the domain form."""
    s = pb.sampling
    return EngineRequest(
        request_id=pb.request_id,
        prompt_token_ids=tuple(pb.prompt_token_ids),
        max_new_tokens=pb.max_new_tokens,
        ignore_eos=pb.ignore_eos,
        cache_salt=pb.cache_salt,
        sampling=SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            seed=s.seed if s.HasField("seed") else None,
            # NOTE: 0 on the wire is an old client's unset field: off.
            repetition_penalty=s.repetition_penalty or 1.0,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            min_p=s.min_p,
            logit_bias=tuple(sorted(s.logit_bias.items())),
        ),
        min_new_tokens=pb.min_new_tokens,
        stop_token_ids=tuple(pb.stop_token_ids),
        logprobs=pb.logprobs if pb.HasField("logprobs") else None,
        prompt_logprobs=pb.prompt_logprobs if pb.HasField("prompt_logprobs") else None,
        n=pb.n or 1,
        structured_output=(
            structured_output_from_pb(pb.structured_output)
            if pb.HasField("structured_output")
            else None
        ),
        num_resumed_output_tokens=min(pb.num_resumed_output_tokens, len(pb.prompt_token_ids)),
    )


def _logprobs_to_pb(p: PositionLogprobs) -> scheduler_pb2.EngineLogprobs:
    return scheduler_pb2.EngineLogprobs(
        token_id=p.chosen.token_id,
        logprob=p.chosen.logprob,
        rank=p.rank,
        top_token_ids=[t.token_id for t in p.top],
        top_logprobs=[t.logprob for t in p.top],
    )


def _logprobs_from_pb(pb: scheduler_pb2.EngineLogprobs) -> PositionLogprobs:
    return PositionLogprobs(
        TokenLogprob(pb.token_id, pb.logprob),
        pb.rank,
        tuple(TokenLogprob(i, lp) for i, lp in zip(pb.top_token_ids, pb.top_logprobs, strict=True)),
    )


def request_output_to_pb(o: RequestOutput) -> scheduler_pb2.EngineOutput:
    """Domain step output to the wire form."""
    return scheduler_pb2.EngineOutput(
        new_token_ids=o.new_token_ids,
        finish_reason=int(o.finish_reason),
        num_prompt_tokens=o.num_prompt_tokens,
        num_cached_tokens=o.num_cached_tokens,
        index=o.index,
        logprobs=[_logprobs_to_pb(p) for p in o.logprobs],
        prompt_logprobs=[_logprobs_to_pb(p) for p in o.prompt_logprobs],
    )


def request_output_from_pb(request_id: str, pb: scheduler_pb2.EngineOutput) -> RequestOutput:
    """Wire step output to the domain form."""
    return RequestOutput(
        request_id,
        tuple(pb.new_token_ids),
        FinishReason(pb.finish_reason),
        pb.num_prompt_tokens,
        pb.num_cached_tokens,
        pb.index,
        tuple(_logprobs_from_pb(p) for p in pb.logprobs),
        tuple(_logprobs_from_pb(p) for p in pb.prompt_logprobs),
    )


def scheduler_stats_request_to_pb() -> scheduler_pb2.SchedulerStatsRequest:
    """A GetStats request (it has no fields)."""
    return scheduler_pb2.SchedulerStatsRequest()


def scheduler_stats_to_pb(
    counters: Any,
    block_size: int,
    not_serving_reason: str,
    role: SchedulerRole,
) -> scheduler_pb2.SchedulerStats:
    """A GetStats answer.

    Args:
        counters: the engine's ``EngineStats`` (zerolayer.scheduler.core.engine, which a shared
            module cannot import): a dataclass whose every field is a SchedulerStats field of
            the same name.
        block_size: tokens per KV block.
        not_serving_reason: why the engine refuses work ("" while it serves).
        role: active, or a standby not activated yet.

    Raises:
        ValueError: a field of ``counters`` that SchedulerStats lacks.
    """
    return scheduler_pb2.SchedulerStats(
        **dataclasses.asdict(counters),
        block_size=block_size,
        not_serving_reason=not_serving_reason,
        role=int(role),
    )


def block_size_from_stats_pb(pb: scheduler_pb2.SchedulerStats) -> int:
    """The KV block size (tokens) a GetStats answer reports."""
    return pb.block_size


def not_serving_reason_from_stats_pb(pb: scheduler_pb2.SchedulerStats) -> str:
    """Why the scheduler stopped serving while it runs ("" when it did not), from GetStats."""
    return pb.not_serving_reason


def role_from_stats_pb(pb: scheduler_pb2.SchedulerStats) -> SchedulerRole:
    """The role a GetStats answer reports (UNSPECIFIED from a scheduler that predates roles)."""
    return SchedulerRole(pb.role)


def abort_sample_request_to_pb(request_id: str, index: int) -> scheduler_pb2.AbortSampleRequest:
    """Which sample to end: the request's id in the scheduler and the sample's index."""
    return scheduler_pb2.AbortSampleRequest(request_id=request_id, index=index)


def abort_sample_request_from_pb(pb: scheduler_pb2.AbortSampleRequest) -> tuple[str, int]:
    """(request_id, index) of an AbortSample call."""
    return pb.request_id, pb.index


def abort_sample_response_to_pb() -> scheduler_pb2.AbortSampleResponse:
    """AbortSample's (empty) answer."""
    return scheduler_pb2.AbortSampleResponse()


def activate_request_to_pb() -> scheduler_pb2.ActivateRequest:
    """An Activate request (it has no fields)."""
    return scheduler_pb2.ActivateRequest()


def activate_response_to_pb(previous_role: SchedulerRole) -> scheduler_pb2.ActivateResponse:
    """An Activate answer: the role before the call."""
    return scheduler_pb2.ActivateResponse(previous_role=int(previous_role))


def activate_response_from_pb(pb: scheduler_pb2.ActivateResponse) -> SchedulerRole:
    """The role an activated scheduler had before the call."""
    return SchedulerRole(pb.previous_role)
