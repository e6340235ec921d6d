"""Several samples of one prompt (``EngineRequest.n`` > 1), the prompt prefilled once.

A request with n > 1 is admitted and prefilled as sample 0. In the step whose forward reaches its
last prompt token, before sampling, it forks: samples 1 to n - 1 are made, each an ordinary
request with the same prompt and settings and its own seed, ``seed + i`` (mod 2**64). A sample
takes the prompt's full blocks by reference (the prefix cache's lookup, which counts a reference
for this scheduler at the kvstore: the blocks sample 0 just committed), and gets a copy of the
rest of the prompt's KV (the partial last block; every block when prefix caching is off) in
blocks of its own (copy-on-write: sample 0 writes its next tokens into its own partial block).
All n samples then draw their first token from sample 0's logits row, each with its seed at the
same position, and run as separate requests from then on.

Since a token is drawn from (seed, position) (:mod:`zerolayer.scheduler.model.sampler`), sample
``i`` yields exactly what a lone request with seed ``seed + i`` yields, wherever it runs: a
sample that cannot get blocks or a running slot at the fork waits and is prefilled itself
(reusing the prompt's cached blocks on admission), and a preempted one is recomputed, with the
same tokens either way.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zerolayer.common.generation import sample_seed
from zerolayer.scheduler.core.kv_cache_manager import KVStoreUnavailable
from zerolayer.scheduler.core.request import Request, RequestStatus
from zerolayer.scheduler.core.scheduler_output import ScheduledRequest, SchedulerOutput

if TYPE_CHECKING:
    from zerolayer.scheduler.core.scheduler import Scheduler

MAX_SAMPLES = 16
"""Most samples of one request (``n``)."""


@dataclass
class SampleFork:
    """What a step's forks need from the engine before it samples."""

    parent_rows: list[int] = field(default_factory=list)
    """For each sample appended to ``SchedulerOutput.scheduled``, in order: the logits row
    (among the rows that sample) of its sample 0, whose row it draws its first token from."""
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    """(source block_id, destination block_id) pairs whose KV (every layer, K and V) must be
    copied before the next step."""
    samples: list[Request] = field(default_factory=list)
    """Every sample made by the fork (running or waiting), for the engine to give each its own
    structured-output matcher."""


def needs_fork(request: Request) -> bool:
    """True for sample 0 of a request with n > 1 whose other samples are not made yet."""
    return request.engine_request.n > 1 and request.index == 0 and not request.samples


def make_sample(parent: Request, index: int) -> Request:
    """Sample ``index`` of ``parent``'s request: the same prompt and settings, n = 1, seed
    :func:`sample_seed` of the parent's (drawn at random when the client gave none), untraced
    (the request's spans are sample 0's). Holds no blocks."""
    sampling = dataclasses.replace(parent.sampling, seed=sample_seed(parent.seed, index))
    # NOTE: the prompt's logprobs are sample 0's alone (they are the same for every sample).
    engine_request = dataclasses.replace(
        parent.engine_request, n=1, sampling=sampling, prompt_logprobs=None
    )
    child = Request(engine_request, parent.arrival_index, None)
    child.index = index
    child.arrival_time = parent.arrival_time
    child.admitted_time = time.monotonic()
    child.num_cached_tokens = parent.num_cached_tokens
    return child


def fork_samples(scheduler: Scheduler, output: SchedulerOutput) -> SampleFork:
    """Forks every request of ``output`` that reaches its last prompt token and has n > 1.

    Call after the step's forward ran (the prompt's KV is in the cache) and before sampling.
    Samples that got blocks are appended to ``output.scheduled`` (0 new tokens, sampling) and to
    the running set; the others wait at the head of the queue, holding nothing.

    Never raises: a kvstore failure only makes the samples wait.
    """
    fork = SampleFork()
    rows = [item for item in output.scheduled if item.samples]
    for row, item in enumerate(rows):
        parent = item.request
        if not needs_fork(parent):
            continue
        # NOTE: the prompt's full blocks are committed now (update would, after sampling), so
        # the samples' lookup finds them.
        parent.num_computed_tokens = item.num_computed_tokens + item.num_new_tokens
        scheduler.kv.commit_full_blocks([parent])
        waiting: list[Request] = []
        for index in range(1, parent.engine_request.n):
            child = make_sample(parent, index)
            parent.samples.append(child)
            fork.samples.append(child)
            if _share_prompt(scheduler, parent, child, fork.block_copies):
                child.status = RequestStatus.RUNNING
                scheduler.running.append(child)
                output.scheduled.append(
                    ScheduledRequest(child, child.num_prompt_tokens, 0, samples=True)
                )
                fork.parent_rows.append(row)
            else:
                waiting.append(child)
        scheduler.waiting.extendleft(reversed(waiting))
    return fork


def _share_prompt(
    scheduler: Scheduler, parent: Request, child: Request, copies: list[tuple[int, int]]
) -> bool:
    """Gives ``child`` the prompt's KV: the cached full blocks by reference, copies of the rest.
    Returns False (the child holding nothing) when the running set is full or blocks are
    missing."""
    if len(scheduler.running) >= scheduler.policy.max_num_seqs:
        return False
    kv = scheduler.kv
    try:
        num_shared = kv.get_computed_blocks(child) // kv.block_size
        admitted = kv.allocate_slots(child, child.num_prompt_tokens - child.num_computed_tokens)
    except KVStoreUnavailable:
        admitted = False
    if not admitted:
        kv.free(child)
        child.num_computed_tokens = 0
        return False
    num_blocks = len(child.block_ids)
    sources = parent.block_ids[num_shared:num_blocks]
    copies.extend(zip(sources, child.block_ids[num_shared:], strict=True))
    child.num_computed_tokens = child.num_prompt_tokens
    return True
