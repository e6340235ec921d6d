"""The prefix-cache counters count each admitted request's lookup once: not once per admission
attempt while the request waits for free blocks, nor again when a preempted request is
recomputed (issue 19: 6 requests had given 201 lookups)."""

from __future__ import annotations

from collections.abc import Iterator

from factories import make_engine_request, make_scheduler

from zerolayer.common.generation import FinishReason
from zerolayer.kvstore.in_process import LocalBlockAllocator
from zerolayer.scheduler.core.request import RequestStatus
from zerolayer.scheduler.core.scheduler import Scheduler

BLOCK_SIZE = 4
PROMPT = list(range(10, 19))
"""9 tokens: two full blocks before the last token."""


def step(scheduler: Scheduler, tokens: Iterator[int]) -> list[str]:
    """One step with fake sampled tokens; returns the preempted request ids."""
    output = scheduler.schedule()
    sampled = [next(tokens) for s in output.scheduled if s.samples]
    scheduler.update(output, sampled)
    return output.preempted_request_ids


def counted(allocator: LocalBlockAllocator) -> tuple[int, int, int]:
    s = allocator.stats
    return s.num_queries, s.num_query_tokens, s.num_hit_tokens


def test_a_request_waiting_for_blocks_is_counted_once_when_admitted() -> None:
    scheduler, allocator = make_scheduler(4, BLOCK_SIZE)
    tokens = iter(range(100, 1000))
    a = scheduler.add_request(make_engine_request("a", PROMPT, 3))
    step(scheduler, tokens)  # a prefills 9 tokens in blocks 0, 1, 2; 0 and 1 are committed
    assert (a.block_ids, counted(allocator)) == ([0, 1, 2], (1, 9, 0))
    # b shares a's first two blocks but needs two more blocks; only block 3 is free.
    b = scheduler.add_request(make_engine_request("b", PROMPT[:8] + list(range(50, 56)), 2))
    step(scheduler, tokens)
    step(scheduler, tokens)  # a's last token: a finishes and frees its blocks
    assert b.status == RequestStatus.WAITING and a.finish_reason == FinishReason.LENGTH
    step(scheduler, tokens)  # b looked up a third time: admitted, with 8 cached tokens
    assert (b.status, b.num_cached_tokens, b.block_ids) == (RequestStatus.RUNNING, 8, [0, 1, 3, 2])
    assert counted(allocator) == (2, 9 + 14, 8)


def test_a_preempted_request_is_not_counted_again_when_recomputed() -> None:
    scheduler, allocator = make_scheduler(2, BLOCK_SIZE)
    tokens = iter(range(100, 1000))
    scheduler.add_request(make_engine_request("a", [10, 11], 2))
    b = scheduler.add_request(make_engine_request("b", [20, 21, 22, 23], 2))
    step(scheduler, tokens)
    assert step(scheduler, tokens) == ["b"]
    step(scheduler, tokens)  # b recomputes its prompt and first output token
    assert b.finish_reason == FinishReason.LENGTH and b.num_preemptions == 1
    assert counted(allocator) == (2, 2 + 4, 0)
