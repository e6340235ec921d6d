"""Continuous (iteration-level) batching with chunked prefill and recompute preemption.

Each step feeds every running request its next tokens (a decode token, or a chunk of prompt), then
admits waiting requests while the token budget, ``max_num_seqs`` and free KV blocks allow. When a
running request cannot get a block, the most recently admitted request is preempted: its blocks are
freed and it is recomputed from scratch later. Sources: Yu et al. 2022, "Orca" (iteration-level
scheduling); Kwon et al. 2023, "PagedAttention" (recompute preemption); Agrawal et al. 2023,
"SARATHI" (chunked prefill).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass

from zerolayer.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from zerolayer.common.generation import EngineRequest, FinishReason, RequestOutput
from zerolayer.common.settings import KV_UNAVAILABLE_TIMEOUT_S
from zerolayer.scheduler.core.kv_cache_manager import KVCacheManager, KVStoreUnavailable
from zerolayer.scheduler.core.request import Request, RequestStatus
from zerolayer.scheduler.core.sample_fork import MAX_SAMPLES, SampleFork, fork_samples
from zerolayer.scheduler.core.scheduler_output import ScheduledRequest, SchedulerOutput
from zerolayer.scheduler.core.trace import RequestTraceHooks


@dataclass(frozen=True)
class SchedulingPolicy:
    """Limits of one scheduling step."""

    max_num_seqs: int
    """Most requests in the running set."""
    max_num_batched_tokens: int
    """Token budget per step."""
    max_model_len: int
    """Context length: prompt plus output never exceed it."""
    kv_unavailable_timeout_s: float = KV_UNAVAILABLE_TIMEOUT_S.default
    """How long requests that need the kvstore wait for it to come back (a supervised kvstore
    restarts in seconds); after that they end with UNAVAILABLE."""


class Scheduler:
    """Owns the waiting queue and running set; not thread-safe (the engine thread drives it)."""

    def __init__(
        self, policy: SchedulingPolicy, kv: KVCacheManager, eos_token_ids: tuple[int, ...]
    ) -> None:
        self.policy = policy
        self.kv = kv
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._arrivals = 0
        self.on_finished: Callable[[Request], None] | None = None
        """Called with each sequence (each sample of n > 1) as it ends, whatever ended it (its
        last token, an abort, a failure), after its ``finish_reason`` is set; None: nobody
        listens. The engine's metrics listen (:meth:`SchedulerMetrics.on_finished`)."""

    def add_request(
        self, engine_request: EngineRequest, trace: RequestTraceHooks | None = None
    ) -> Request:
        """Queues a request, whose spans ``trace`` records (None: untraced).

        Raises:
            InvalidArgument: request_id already in flight; empty prompt; max_new_tokens 0; prompt
                at or past the context length; n outside 1..16.
            ResourceExhausted: the request could never fit in the whole KV arena.
        """
        if engine_request.request_id in self.requests:
            raise InvalidArgument("request_id", f"{engine_request.request_id!r} is in flight")
        num_prompt = len(engine_request.prompt_token_ids)
        if num_prompt == 0:
            raise InvalidArgument("prompt_token_ids", "empty")
        if engine_request.max_new_tokens <= 0:
            raise InvalidArgument("max_new_tokens", "must be > 0")
        if not 1 <= engine_request.n <= MAX_SAMPLES:
            raise InvalidArgument("n", f"must be 1 to {MAX_SAMPLES}, got {engine_request.n}")
        if num_prompt >= self.policy.max_model_len:
            raise InvalidArgument(
                "prompt", f"{num_prompt} tokens; the context length is {self.policy.max_model_len}"
            )
        # The last generated token is never fed back, so its KV is never stored.
        max_kv = min(num_prompt + engine_request.max_new_tokens, self.policy.max_model_len) - 1
        total = self.kv.num_blocks_total
        if self.kv.num_blocks_for(max_kv) > total:
            field = "prompt" if self.kv.num_blocks_for(num_prompt) > total else "max_new_tokens"
            raise ResourceExhausted(
                f"{field}: {max_kv} tokens of KV need {self.kv.num_blocks_for(max_kv)} blocks, "
                f"the arena has {total}"
            )
        request = Request(engine_request, self._arrivals, trace)
        self._arrivals += 1
        self.requests[request.request_id] = request
        self.waiting.append(request)
        return request

    def abort_request(self, request_id: str) -> bool:
        """Removes a request (every sample of it) and frees its blocks at once. Returns False if
        it is unknown."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        for sample in [request, *request.samples]:
            if not sample.is_finished:
                self._finish(sample, FinishReason.ABORT)
        return True

    def abort_sample(self, request_id: str, index: int) -> RequestOutput | None:
        """Ends sample ``index`` of a request (with ABORT) and frees its blocks at once.

        Returns:
            The sample's last output (no tokens, ABORT); None when the request or the sample is
            unknown (not forked yet included) or the sample had finished.
        """
        request = self.requests.get(request_id)
        samples = [] if request is None else [request, *request.samples]
        sample = next((s for s in samples if s.index == index), None)
        if sample is None or sample.is_finished:
            return None
        self._finish(sample, FinishReason.ABORT)
        return RequestOutput(
            request_id,
            (),
            FinishReason.ABORT,
            sample.num_prompt_tokens,
            sample.num_cached_tokens,
            index,
        )

    def abort_all_requests(self) -> list[str]:
        """Aborts every request in flight (after a failure); returns their ids in arrival order.

        Never raises: a request whose abort fails (the kvstore may be what failed) is dropped
        anyway, its blocks left to the next reconcile (:meth:`KVCacheManager.forget`).
        """
        request_ids = list(self.requests)
        for request_id in request_ids:
            request = self.requests[request_id]
            try:
                self.abort_request(request_id)
            except Exception:  # noqa: BLE001 - the kvstore may be what failed: recount later
                for sample in [request, *request.samples]:
                    self.kv.forget(sample)
                self.requests.pop(request_id, None)
        self.running.clear()
        self.waiting.clear()
        return request_ids

    def annotate(self, name: str, attributes: Mapping[str, str | int]) -> None:
        """Adds an event to the trace of every request in flight (untraced ones are skipped)."""
        for request in self.requests.values():
            if request.trace is not None:
                request.trace.add_event(name, attributes)

    @property
    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        """Requests in the running set."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission (new or preempted)."""
        return len(self.waiting)

    def schedule(self) -> SchedulerOutput:
        """Plans the next step (taking cached prefixes and allocating KV blocks for it).

        While the kvstore is unusable, requests that fit in the blocks they hold keep running;
        those that need a new block, and admissions, wait for it to come back, for at most
        ``policy.kv_unavailable_timeout_s``; then they are ended (``SchedulerOutput.failed``).
        When the kvstore released this scheduler's references (its lease is lost, before or
        during planning), every running request is recomputed (:meth:`_recompute_running`).
        """
        output = SchedulerOutput()
        if self.kv.lease_lost():
            self._recompute_running()
        num_probes = self.kv.num_reconcile_attempts
        kv_usable = not self.kv.needs_reconcile or self.kv.reconcile(self.running)
        budget = self.policy.max_num_batched_tokens
        blocked: list[Request] = []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            try:
                if not self._allocate_or_preempt(request, num_new, output):
                    break  # the request itself was preempted; everything after it too
            except KVStoreUnavailable:
                kv_usable = False
                blocked.append(request)
                index += 1
                continue
            output.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
            index += 1
        while (
            kv_usable
            and self.waiting
            and budget > 0
            and not output.preempted_request_ids
            and len(self.running) < self.policy.max_num_seqs
        ):
            request = self.waiting[0]
            try:
                num_new = self._admit(request, budget)
            except KVStoreUnavailable:
                break
            if num_new is None:
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            output.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
        if self.kv.lease_lost():
            # A call of this step found the lease lost: nothing planned may write its blocks.
            self._recompute_running()
            return SchedulerOutput()
        if not kv_usable:
            probed = self.kv.num_reconcile_attempts > num_probes
            self._fail_if_kv_down_too_long(blocked, output, probed)
        return output

    def _fail_if_kv_down_too_long(
        self, blocked: list[Request], output: SchedulerOutput, probed: bool
    ) -> None:
        """Ends the requests waiting on the kvstore once it has been unusable for longer than
        ``kv_unavailable_timeout_s``: the waiting ones and the running ones that need a block.
        Running requests that fit in the blocks they hold go on. Unless this step already asked,
        the kvstore is probed once more first (reconcile attempts are spaced out), so a request
        is not failed for an outage that has just ended."""
        since = self.kv.unusable_since
        timeout_s = self.policy.kv_unavailable_timeout_s
        if since is None or self.kv.clock() - since < timeout_s:
            return
        if not probed and self.kv.reconcile(self.running, force=True):
            return  # back after all: they are scheduled next step
        error = Unavailable(
            f"kvstore: unusable for more than {timeout_s:g} s ({self.kv.last_error}); "
            "the request needs it for KV blocks"
        )
        for request in [*blocked, *self.waiting]:
            # Every sample of the request ends with it (some may be planned in this step).
            if self.abort_request(request.request_id):
                output.failed[request.request_id] = error
        output.scheduled = [item for item in output.scheduled if not item.request.is_finished]

    @staticmethod
    def _scheduled(request: Request, num_new: int) -> ScheduledRequest:
        first = request.num_computed_tokens
        return ScheduledRequest(request, first, num_new, first + num_new == request.num_tokens)

    def _admit(self, request: Request, budget: int) -> int | None:
        """Takes the request's cached prefix and blocks for its first chunk.

        Returns:
            Tokens to feed this step, or None when the pool is full (nothing is held then).
        """
        trace = request.trace
        with trace.context_load() if trace is not None else nullcontext():
            num_cached = self.kv.get_computed_blocks(request)
            if request.status == RequestStatus.WAITING:
                # Only a first admission reports cached prompt tokens (a recompute after
                # preemption, even one before the first output token, may hit its own blocks).
                request.num_cached_tokens = min(num_cached, request.num_prompt_tokens)
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            first = request.status == RequestStatus.WAITING
            try:
                admitted = self.kv.allocate_slots(request, num_new, count_lookup=first)
            except KVStoreUnavailable:
                self._release(request)
                raise
            if trace is not None:
                num_pinned = min(request.num_pinned_tokens, request.num_cached_tokens)
                trace.set_context(request.num_prompt_tokens, request.num_cached_tokens, num_pinned)
        if not admitted:
            self._release(request)
            return None
        if trace is not None:
            trace.admitted()
        if request.admitted_time is None:
            request.admitted_time = time.monotonic()
        return num_new

    def _release(self, request: Request) -> None:
        self.kv.free(request)
        request.num_computed_tokens = 0

    def _allocate_or_preempt(self, request: Request, num_new: int, output: SchedulerOutput) -> bool:
        while not self.kv.allocate_slots(request, num_new):
            victim = self.running.pop()
            self._preempt(victim)
            output.preempted_request_ids.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _recompute_running(self) -> None:
        """Preempts every running request without touching the kvstore: the blocks they hold
        are no longer this scheduler's (its lease is lost), so nothing may be written into them;
        they are recomputed from scratch (the path of a preemption), in their order, admitted
        again in this step once the scheduler registered again."""
        for request in reversed(self.running):
            self.kv.forget(request)
            request.num_computed_tokens = 0
            request.num_preemptions += 1
            request.status = RequestStatus.PREEMPTED
            self.waiting.appendleft(request)
            self.num_preemptions += 1
        self.running.clear()
        self.kv.needs_reconcile = True  # registers again, holding nothing

    def _preempt(self, request: Request) -> None:
        self._release(request)
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def fork_samples(self, output: SchedulerOutput) -> SampleFork:
        """Makes the other samples of the requests with n > 1 whose prompt this step completes;
        see :func:`zerolayer.scheduler.core.sample_fork.fork_samples`. Call after the forward,
        before sampling."""
        return fork_samples(self, output)

    def update(self, output: SchedulerOutput, sampled_token_ids: list[int]) -> list[RequestOutput]:
        """Applies a step's results.

        Args:
            sampled_token_ids: one token per scheduled request whose ``samples`` is True, in the
                order of ``output.scheduled``.

        Returns:
            One output per request that got a new token (finished ones carry their reason).
        """
        results: list[RequestOutput] = []
        for item in output.scheduled:
            item.request.num_computed_tokens = item.num_computed_tokens + item.num_new_tokens
        # Register full blocks before any request finishes and frees them: a follow-up turn then
        # reuses this answer's KV as well as its prompt's.
        self.kv.commit_full_blocks(item.request for item in output.scheduled)
        tokens = iter(sampled_token_ids)
        for item in output.scheduled:
            request = item.request
            if not item.samples:
                continue
            token_id = next(tokens)
            request.output_token_ids.append(token_id)
            if request.grammar is not None:
                request.grammar.accept(token_id)
            if request.trace is not None and len(request.output_token_ids) == 1:
                request.trace.first_token()
            reason = self._check_stop(request, token_id)
            if reason != FinishReason.UNSPECIFIED:
                self._finish(request, reason)
            results.append(
                RequestOutput(
                    request.request_id,
                    (token_id,),
                    reason,
                    request.num_prompt_tokens,
                    request.num_cached_tokens,
                    request.index,
                )
            )
        return results

    def _check_stop(self, request: Request, token_id: int) -> FinishReason:
        if request.grammar is not None and request.grammar.is_done:
            # NOTE: a failed matcher ends the request as aborted; the engine sends its error.
            return FinishReason.ABORT if request.grammar.error is not None else FinishReason.EOS
        # NOTE: EOS and stop ids end nothing before min_new_tokens (the sampler masks them too).
        if len(request.output_token_ids) > request.min_new_tokens:
            if not request.ignore_eos and token_id in self.eos_token_ids:
                return FinishReason.EOS
            if token_id in request.stop_token_ids:
                return FinishReason.STOP
        if len(request.output_token_ids) >= request.max_new_tokens:
            return FinishReason.LENGTH
        if request.num_tokens >= self.policy.max_model_len:
            return FinishReason.LENGTH
        return FinishReason.UNSPECIFIED

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.trace is not None:
            request.trace.finished(
                reason,
                request.num_prompt_tokens,
                request.num_cached_tokens,
                len(request.output_token_ids),
                request.num_preemptions,
            )
        self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        if self.on_finished is not None:
            self.on_finished(request)
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        first = self.requests[request.request_id]
        if all(sample.is_finished for sample in [first, *first.samples]):
            del self.requests[request.request_id]
