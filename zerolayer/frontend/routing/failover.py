"""Continuing a generation on another scheduler when the one carrying it dies.

The frontend keeps what a resubmission needs (:class:`InFlight`): the original request and every
token generated so far. A resubmission sends the original prompt plus those tokens as its prompt,
the rest of the token budget, and the same sampling settings; the scheduler recomputes their KV
(or finds it in the shared prefix cache) and goes on. Greedy output is then the same token for
token, as the engine's recompute preemption is; sampled output is too because every sampled
request carries a seed (:func:`with_seed` draws one where the client gave none) and the sampler
draws from (seed, position). The frontend's detokenizer and stop strings continue as they were.

A request with n > 1 is resubmitted whole while none of its samples has produced a token. After
that, each unfinished sample ``i`` goes on as a request of its own (:meth:`InFlight.split`): n = 1,
seed ``seed + i``, its prompt plus its own tokens so far; a lone request with that seed draws
what sample ``i`` would have drawn, so no sample is lost, repeated or changed.

A request that schedulers keep dying under may be what kills them (a *poison* request): it ends
with UNAVAILABLE instead of being sent to the next one, at its :data:`MAX_INCIDENTS`-th loss
*incident*. A loss is one scheduler dying (or going away) while it may have had the request. The
first loss begins an incident; the second belongs to it when the frontend sees it within
:data:`INCIDENT_WINDOW_S` of the first: schedulers killed together (a host going down, an
operator's ``kill``) lose the request on the first and then, resubmitted within a millisecond, on
the next, which was dying too. Every other loss begins a new incident. Hence:

- a poison request that kills each scheduler it reaches ends after killing two when it takes
  longer than :data:`INCIDENT_WINDOW_S` to kill the second, and after three at most otherwise;
- an honest request ends only when three schedulers die under it, or two more than
  :data:`INCIDENT_WINDOW_S` apart (e.g. three schedulers killed together, with the request
  resubmitted to each of the others as they die).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable

from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import EngineRequest, FinishReason, RequestOutput, sample_seed

MAX_INCIDENTS = 2
"""Loss incidents of the same request after which it is not retried (see the module docstring)."""
INCIDENT_WINDOW_S = 1.0
"""A request's second scheduler loss this soon after its first, seconds, is the same incident."""
RESUBMISSION_ID_BYTES = 16
"""Random bytes (hex in the id) that make a resubmission's request id unlike any a client sends."""


def draw_seed() -> int:
    """A fresh random seed in the uint64 range of ``SamplingParams.seed``."""
    return secrets.randbits(64)


def resubmission_id(request_id: str) -> str:
    """The request id of one resubmission of ``request_id``: ``<id>~<32 hex digits>``, drawn afresh
    each time. A client's own id (any string) equals it only by guessing 128 random bits, so no
    client request in flight can refuse it, and it never meets an earlier submission of the same
    request in a scheduler that has not noticed that one end."""
    return f"{request_id}~{secrets.token_hex(RESUBMISSION_ID_BYTES)}"


def with_seed(request: EngineRequest, draw_seed: Callable[[], int]) -> EngineRequest:
    """``request`` with a seed from ``draw_seed`` when it samples without one (greedy and seeded
    requests are returned as they are), so that a resubmission continues the same random
    stream. The drawn seed is the frontend's own: it is not shown to the client or traced."""
    sampling = request.sampling
    if sampling.is_greedy or sampling.seed is not None:
        return request
    return dataclasses.replace(request, sampling=dataclasses.replace(sampling, seed=draw_seed()))


class InFlight:
    """One request's progress across the schedulers that carry it, from the frontend's side."""

    def __init__(self, request: EngineRequest, max_model_len: int, fresh_ids: bool = False) -> None:
        """
        Args:
            request: the request as validated (with its seed, see :func:`with_seed`).
            max_model_len: the model's context length, tokens.
            fresh_ids: the first submission's id is a :func:`resubmission_id` too (a tenant's
                request: ids are unique per tenant only, so the client's id may be another
                tenant's in the scheduler).
        """
        self.request = request
        self.fresh_ids = fresh_ids
        self.max_model_len = max_model_len
        self.generated_token_ids: list[int] = []
        """Tokens generated so far (sample 0's, with n > 1)."""
        self.sample_token_ids: list[list[int]] = [self.generated_token_ids]
        self.sample_token_ids += [[] for _ in range(request.n - 1)]
        """Each sample's tokens so far, by index."""
        self.finished_indexes: set[int] = set()
        """Samples that have had their finished output."""
        self.submitted_to: tuple[str, str] | None = None
        """(scheduler address, request id there) of the current submission; None before."""
        self.split_samples: dict[int, InFlight] = {}
        """Once split (:meth:`split`): the unfinished samples' own requests, by index."""
        self.num_outputs = 0
        """Outputs received, of every sample."""
        self.num_finished = 0
        """Samples that have finished (the request is done at ``n``)."""
        self.num_cached_tokens: int | None = None
        """Prompt tokens found in the prefix cache by the first admission (None: not yet)."""
        self.num_losses = 0
        """Schedulers that died while carrying the request."""
        self.num_incidents = 0
        """Loss incidents among those (see the module docstring)."""
        self._incident_at_s: float | None = None
        """When the latest incident began (time.monotonic), seconds."""
        self.num_submissions = 0
        self._answered = False
        """The current submission has produced an output (its prompt is prefilled)."""

    @property
    def finished(self) -> bool:
        """True once every sample (``n`` of them) has had its finished output."""
        return self.num_finished >= self.request.n

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens the request may still generate: its budget, within the context length."""
        num_generated = len(self.generated_token_ids)
        num_tokens = len(self.request.prompt_token_ids) + num_generated
        return min(self.request.max_new_tokens - num_generated, self.max_model_len - num_tokens)

    @property
    def num_outstanding_tokens(self) -> int:
        """Work still ahead of the request at its scheduler, tokens: its prompt (the original one
        plus the tokens generated before this submission) until the first output, then the
        tokens still to generate."""
        if self._answered:
            return self.num_remaining_tokens
        num_prompt = len(self.request.prompt_token_ids) + len(self.generated_token_ids)
        return num_prompt + self.num_remaining_tokens

    def submission(self) -> EngineRequest:
        """The request to send next: the original prompt followed by every token generated so
        far, the remaining budget and the same sampling settings. The first keeps the request id
        (unless ``fresh_ids``); a resubmission's is :func:`resubmission_id` (the client only ever
        sees its own id: see :meth:`received`).

        Raises:
            ValueError: nothing remains to generate (see :meth:`finish_if_spent`).
        """
        if self.num_remaining_tokens <= 0:
            raise ValueError("the request has no tokens left to generate")
        keep_id = self.num_submissions == 0 and not self.fresh_ids
        self.num_submissions += 1
        self._answered = False
        request = self.request
        return dataclasses.replace(
            request,
            request_id=request.request_id if keep_id else resubmission_id(request.request_id),
            prompt_token_ids=(*request.prompt_token_ids, *self.generated_token_ids),
            max_new_tokens=self.num_remaining_tokens,
            min_new_tokens=max(0, request.min_new_tokens - len(self.generated_token_ids)),
            # NOTE: prompt logprobs came with the first output; a continuation sends none again.
            prompt_logprobs=None if self.generated_token_ids else request.prompt_logprobs,
            num_resumed_output_tokens=request.num_resumed_output_tokens
            + len(self.generated_token_ids),
        )

    def received(self, output: RequestOutput) -> RequestOutput:
        """Records one output of the current submission and returns it as the original request's:
        its id, its prompt length, and the cached prompt tokens of the first admission."""
        self._answered = True
        self.num_outputs += 1
        self.num_finished += output.finished
        self.sample_token_ids[output.index].extend(output.new_token_ids)
        if output.finished:
            self.finished_indexes.add(output.index)
        if self.num_cached_tokens is None:
            self.num_cached_tokens = output.num_cached_tokens
        return dataclasses.replace(
            output,
            request_id=self.request.request_id,
            num_prompt_tokens=len(self.request.prompt_token_ids),
            num_cached_tokens=self.num_cached_tokens,
        )

    def lost(self, carrying: bool, at_s: float) -> None:
        """The current submission's scheduler went away; ``carrying``: it may have had the
        request (see :class:`zerolayer.common.errors.SchedulerLost`); ``at_s``: when the frontend
        saw it (time.monotonic), seconds.

        Raises:
            Unavailable: the loss begins the :data:`MAX_INCIDENTS`-th incident (the request may be
                what kills schedulers; see the module docstring).
        """
        if not carrying:
            return
        self.num_losses += 1
        if (
            self._incident_at_s is not None
            and self.num_losses == 2
            and at_s - self._incident_at_s <= INCIDENT_WINDOW_S
        ):
            return  # NOTE: the scheduler it was resubmitted to was dying with the first one
        self.num_incidents += 1
        self._incident_at_s = at_s
        if self.num_incidents >= MAX_INCIDENTS:
            raise Unavailable(
                f"scheduler: request {self.request.request_id!r} was in flight on "
                f"{self.num_losses} schedulers that died in {self.num_incidents} separate "
                "incidents; it is not retried (it may be what killed them)"
            )

    @property
    def must_split(self) -> bool:
        """True when the request has n > 1 and a sample has produced tokens: it is no longer
        resubmitted whole but sample by sample (:meth:`split`)."""
        return self.request.n > 1 and self.num_outputs > 0

    def split(self) -> list[tuple[int, InFlight]]:
        """Each unfinished sample as a request of its own, with its index: n = 1, seed
        ``seed + index`` (mod 2**64), the tokens it generated so far, this request's loss
        counts and cached prompt tokens. Their submissions all get fresh ids; their outputs
        carry index 0 (the caller gives them theirs back)."""
        samples: list[tuple[int, InFlight]] = []
        for index in range(self.request.n):
            if index in self.finished_indexes:
                continue
            sampling = self.request.sampling
            if sampling.seed is not None:
                sampling = dataclasses.replace(sampling, seed=sample_seed(sampling.seed, index))
            # NOTE: the prompt logprobs came with sample 0's first output, before any split.
            request = dataclasses.replace(
                self.request, n=1, sampling=sampling, prompt_logprobs=None
            )
            sample = InFlight(request, self.max_model_len)
            sample.generated_token_ids.extend(self.sample_token_ids[index])
            sample.num_cached_tokens = self.num_cached_tokens
            sample.num_losses, sample.num_incidents = self.num_losses, self.num_incidents
            sample._incident_at_s = self._incident_at_s
            sample.num_submissions = self.num_submissions
            samples.append((index, sample))
        self.split_samples = dict(samples)
        return samples

    def sample_submission(self, index: int) -> tuple[str, str, int] | None:
        """Where sample ``index`` runs now: (scheduler address, request id there, its index
        there); None when it was never submitted."""
        if self.split_samples:
            sample = self.split_samples.get(index)
            if sample is None or sample.submitted_to is None:
                return None
            return (*sample.submitted_to, 0)
        if self.submitted_to is None:
            return None
        return (*self.submitted_to, index)

    def finish_if_spent(self) -> RequestOutput | None:
        """The last output, finished with LENGTH, when the budget is spent but the scheduler died
        before it said so; None while tokens remain."""
        if self.num_remaining_tokens > 0:
            return None
        return RequestOutput(
            self.request.request_id,
            (),
            FinishReason.LENGTH,
            len(self.request.prompt_token_ids),
            self.num_cached_tokens or 0,
        )
