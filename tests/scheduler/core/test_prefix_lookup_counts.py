"""The prefix-cache counters count each admitted request's lookup once: not once per admission
attempt while the request waits for free blocks, nor again when a preempted request is
recomputed (issue 19: 6 requests had given 201 lookups)."""

from __future__ import annotations

from collections.abc import Iterator

from zerolayer.common.generation import EngineRequest, FinishReason, SamplingParams
from zerolayer.kvstore.in_process import LocalBlockAllocator
from zerolayer.scheduler.core.kv_cache_manager import KVCacheManager
from zerolayer.scheduler.core.request import RequestStatus
from zerolayer.scheduler.core.scheduler import Scheduler, SchedulingPolicy

BLOCK_SIZE = 4
PROMPT = list(range(10, 19))
"""9 tokens: two full blocks before the last token."""


def make_scheduler(num_blocks: int) -> tuple[Scheduler, LocalBlockAllocator]:
    """A scheduler over an in-process pool with prefix caching on."""
    allocator = LocalBlockAllocator(num_blocks, BLOCK_SIZE)
    policy = SchedulingPolicy(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    return Scheduler(policy, KVCacheManager(allocator, BLOCK_SIZE), (2,)), allocator


def make_request(request_id: str, prompt: list[int], max_new_tokens: int) -> EngineRequest:
    return EngineRequest(request_id, tuple(prompt), max_new_tokens, SamplingParams())


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
    scheduler, allocator = make_scheduler(num_blocks=4)
    tokens = iter(range(100, 1000))
    a = scheduler.add_request(make_request("a", PROMPT, max_new_tokens=3))
    step(scheduler, tokens)  # a prefills 9 tokens in blocks 0, 1, 2; 0 and 1 are committed
    assert (a.block_ids, counted(allocator)) == ([0, 1, 2], (1, 9, 0))
    # b shares a's first two blocks but needs two more blocks; only block 3 is free.
    b = scheduler.add_request(make_request("b", PROMPT[:8] + list(range(50, 56)), 2))
    step(scheduler, tokens)
    step(scheduler, tokens)  # a's last token: a finishes and frees its blocks
    assert b.status == RequestStatus.WAITING and a.finish_reason == FinishReason.LENGTH
    step(scheduler, tokens)  # b looked up a third time: admitted, with 8 cached tokens
    assert (b.status, b.num_cached_tokens, b.block_ids) == (RequestStatus.RUNNING, 8, [0, 1, 3, 2])
    assert counted(allocator) == (2, 9 + 14, 8)


def test_a_preempted_request_is_not_counted_again_when_recomputed() -> None:
    scheduler, allocator = make_scheduler(num_blocks=2)
    tokens = iter(range(100, 1000))
    scheduler.add_request(make_request("a", [10, 11], max_new_tokens=2))
    b = scheduler.add_request(make_request("b", [20, 21, 22, 23], max_new_tokens=2))
    step(scheduler, tokens)
    assert step(scheduler, tokens) == ["b"]
    step(scheduler, tokens)  # b recomputes its prompt and first output token
    assert b.finish_reason == FinishReason.LENGTH and b.num_preemptions == 1
    assert counted(allocator) == (2, 2 + 4, 0)
