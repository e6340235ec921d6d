"""Conversion of the scheduler's messages (``zerolayer.v1.Scheduler``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from zerolayer.common.generation import EngineRequest, FinishReason, RequestOutput, SamplingParams
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
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed
        ),
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
        ),
    )


def request_output_to_pb(o: RequestOutput) -> scheduler_pb2.EngineOutput:
    """Domain step output to the wire form."""
    return scheduler_pb2.EngineOutput(
        new_token_ids=o.new_token_ids,
        finish_reason=int(o.finish_reason),
        num_prompt_tokens=o.num_prompt_tokens,
        num_cached_tokens=o.num_cached_tokens,
    )


def request_output_from_pb(request_id: str, pb: scheduler_pb2.EngineOutput) -> RequestOutput:
    """Wire step output to the domain form."""
    return RequestOutput(
        request_id,
        tuple(pb.new_token_ids),
        FinishReason(pb.finish_reason),
        pb.num_prompt_tokens,
        pb.num_cached_tokens,
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


def activate_request_to_pb() -> scheduler_pb2.ActivateRequest:
    """An Activate request (it has no fields)."""
    return scheduler_pb2.ActivateRequest()


def activate_response_to_pb(previous_role: SchedulerRole) -> scheduler_pb2.ActivateResponse:
    """An Activate answer: the role before the call."""
    return scheduler_pb2.ActivateResponse(previous_role=int(previous_role))


def activate_response_from_pb(pb: scheduler_pb2.ActivateResponse) -> SchedulerRole:
    """The role an activated scheduler had before the call."""
    return SchedulerRole(pb.previous_role)
