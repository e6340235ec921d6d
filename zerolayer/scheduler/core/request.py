"""Per-request state inside the scheduler."""

from __future__ import annotations

import enum
import secrets
import time

from zerolayer.common.generation import EngineRequest, FinishReason, PositionLogprobs
from zerolayer.scheduler.core.trace import RequestTraceHooks
from zerolayer.scheduler.model.structured_output import GrammarMatcher


class RequestStatus(enum.IntEnum):
    """States of a request; WAITING -> RUNNING (-> PREEMPTED -> RUNNING)* -> FINISHED."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


class Request:
    """A request's tokens, KV blocks and progress.

    ``num_computed_tokens`` counts the tokens (prompt then output) whose KV is in the cache; the
    next step feeds tokens ``[num_computed_tokens, num_tokens)``.
    """

    def __init__(
        self,
        engine_request: EngineRequest,
        arrival_index: int,
        trace: RequestTraceHooks | None = None,
    ) -> None:
        self.engine_request = engine_request
        """The request as submitted (the samples of n > 1 are made from it)."""
        self.request_id = engine_request.request_id
        self.index = 0
        """Which sample of its request this is (0 to n - 1); its outputs carry it."""
        self.samples: list[Request] = []
        """Sample 0 of a request with n > 1: its other samples, once forked (see
        :mod:`zerolayer.scheduler.core.sample_fork`); empty otherwise."""
        self.prompt_token_ids = list(engine_request.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.max_new_tokens = engine_request.max_new_tokens
        self.sampling = engine_request.sampling
        self.ignore_eos = engine_request.ignore_eos
        self.cache_salt = engine_request.cache_salt
        self.min_new_tokens = engine_request.min_new_tokens
        self.stop_token_ids = frozenset(engine_request.stop_token_ids)
        self.logprobs = engine_request.logprobs
        self.prompt_logprobs = engine_request.prompt_logprobs
        self.num_resumed_output_tokens = engine_request.num_resumed_output_tokens
        """The prompt's last tokens that are earlier output (a failover resubmission)."""
        self.pending_prompt_logprobs: list[PositionLogprobs] = []
        """Prompt logprobs computed but not yet delivered (they go with the next output)."""
        self.num_prompt_logprobs_done = 0
        """Prompt positions whose logprobs were computed (pending or delivered): positions
        1..this; a recompute after preemption does not compute them again."""
        self.arrival_index = arrival_index
        self.status = RequestStatus.WAITING
        self.finish_reason = FinishReason.UNSPECIFIED
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_pinned_tokens = 0
        """Of the tokens its latest prefix lookup found cached, those a kvstore pin held."""
        self.block_ids: list[int] = []
        self.num_committed_blocks = 0
        """Leading blocks of ``block_ids`` already registered in the prefix cache."""
        self.arrival_time = time.monotonic()
        self.admitted_time: float | None = None
        self.last_token_time: float | None = None
        self.trace = trace
        """Records the request's spans when tracing is on (a RequestTrace); None when off."""
        self.num_preemptions = 0
        self.seed = self.sampling.seed if self.sampling.seed is not None else secrets.randbits(64)
        """The seed this request's tokens are drawn with (see
        :mod:`zerolayer.scheduler.model.sampler`): the client's, or a random one from the OS;
        with the position of each token it decides the draw."""
        self.grammar: GrammarMatcher | None = None
        """The structured-output matcher of a constrained request (set by the engine when it
        adds the request); None: free text."""

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def penalized_token_ids(self) -> list[int]:
        """The output as presence and frequency penalties count it: the resumed output at the
        end of the prompt (see ``num_resumed_output_tokens``), then this request's output."""
        resumed = self.num_resumed_output_tokens
        if not resumed:
            return self.output_token_ids
        return self.prompt_token_ids[len(self.prompt_token_ids) - resumed :] + self.output_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output token ids (a new list)."""
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, index: int) -> int:
        """Token id at position ``index`` of prompt + output (no list is built)."""
        num_prompt = len(self.prompt_token_ids)
        if index < num_prompt:
            return self.prompt_token_ids[index]
        return self.output_token_ids[index - num_prompt]

    def token_slice(self, first: int, end: int) -> list[int]:
        """Token ids at positions ``[first, end)`` of prompt + output."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[first:end]
        if first >= num_prompt:
            return self.output_token_ids[first - num_prompt : end - num_prompt]
        return self.prompt_token_ids[first:] + self.output_token_ids[: end - num_prompt]

    @property
    def needs_prompt_logprobs(self) -> bool:
        """True while prompt logprobs were asked and some are still to compute (the prompt is
        then computed, not taken from the prefix cache)."""
        return (
            self.prompt_logprobs is not None
            and self.num_prompt_logprobs_done < self.num_prompt_tokens - 1
        )

    @property
    def is_finished(self) -> bool:
        """True once a finish reason is set."""
        return self.status == RequestStatus.FINISHED
