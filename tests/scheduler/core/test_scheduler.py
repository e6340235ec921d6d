"""Tests for Scheduler + KVCacheManager over an in-process block pool, driven by hand (no model).

Block size 4 throughout: token ``p`` of a request lives in ``block_ids[p // 4]``. Fake sampled
tokens count up from 100, one per sampling request per step, in scheduling order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from factories import make_engine_request, make_scheduler

from zerolayer.common.errors import InvalidArgument, ResourceExhausted
from zerolayer.common.generation import FinishReason, RequestOutput
from zerolayer.kvstore.in_process import LocalBlockAllocator
from zerolayer.scheduler.core.request import RequestStatus
from zerolayer.scheduler.core.scheduler import Scheduler
from zerolayer.scheduler.core.scheduler_output import SchedulerOutput

BLOCK_SIZE = 4
EOS_TOKEN_ID = 2

Plan = list[tuple[str, int, int, bool]]


plain_scheduler = functools.partial(
    make_scheduler, num_blocks=16, block_size=BLOCK_SIZE, enable_prefix_caching=False
)
"""A scheduler over a fresh pool (free queue 0, 1, 2, ...), prefix caching off
(tests/scheduler/core/test_engine_prefix_reuse.py covers it). The requests' prompts here are
``10, 11, ...`` (never EOS)."""


def token_counter(start: int = 100) -> Iterator[int]:
    """Fake sampled tokens 100, 101, 102, ... (distinct, never EOS)."""
    return iter(range(start, 1_000_000))


def plan(output: SchedulerOutput) -> Plan:
    """(request_id, num_computed_tokens, num_new_tokens, samples) of each scheduled request.

    NOTE: ``samples`` compares against the request's live token count, so read it before update.
    """
    return [
        (s.request.request_id, s.num_computed_tokens, s.num_new_tokens, s.samples)
        for s in output.scheduled
    ]


def step(
    scheduler: Scheduler, tokens: Iterator[int]
) -> tuple[Plan, list[str], list[RequestOutput]]:
    """Schedules one step and feeds one fake token to each request that samples.

    Returns:
        (the step's plan, its preempted request ids, the update's outputs).
    """
    output = scheduler.schedule()
    planned = plan(output)
    sampled = [next(tokens) for s in output.scheduled if s.samples]
    return planned, output.preempted_request_ids, scheduler.update(output, sampled)


def run_to_completion(scheduler: Scheduler, tokens: Iterator[int], max_steps: int = 200) -> None:
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests:
            return
        step(scheduler, tokens)
    raise AssertionError("requests did not finish")


def assert_all_free(scheduler: Scheduler, allocator: LocalBlockAllocator) -> None:
    assert allocator.num_free_blocks == allocator.num_blocks
    assert allocator.ref_cnt == [0] * allocator.num_blocks
    assert scheduler.kv.num_blocks_held == scheduler.kv.num_blocks_in_use == 0
    assert not scheduler.running and not scheduler.waiting and not scheduler.requests


def test_admission_in_arrival_order_with_exact_block_ids() -> None:
    scheduler, allocator = plain_scheduler()
    a = scheduler.add_request(make_engine_request("a", range(10, 14), 3))
    b = scheduler.add_request(make_engine_request("b", range(10, 13), 3))
    c = scheduler.add_request(make_engine_request("c", range(10, 15), 3))
    assert [r.request_id for r in scheduler.waiting] == ["a", "b", "c"]
    assert a.status == RequestStatus.WAITING
    tokens = token_counter()

    planned, _, results = step(scheduler, tokens)
    assert planned == [("a", 0, 4, True), ("b", 0, 3, True), ("c", 0, 5, True)]
    assert (a.block_ids, b.block_ids, c.block_ids) == ([0], [1], [2, 3])
    assert [r.request_id for r in scheduler.running] == ["a", "b", "c"]
    assert not scheduler.waiting
    assert a.status == RequestStatus.RUNNING
    assert results == [
        RequestOutput("a", (100,), FinishReason.UNSPECIFIED, 4, 0),
        RequestOutput("b", (101,), FinishReason.UNSPECIFIED, 3, 0),
        RequestOutput("c", (102,), FinishReason.UNSPECIFIED, 5, 0),
    ]
    assert (a.num_computed_tokens, b.num_computed_tokens, c.num_computed_tokens) == (4, 3, 5)

    # a's position 4 needs a second block; b's position 3 still fits in block 1.
    planned, _, results = step(scheduler, tokens)
    assert planned == [("a", 4, 1, True), ("b", 3, 1, True), ("c", 5, 1, True)]
    assert (a.block_ids, b.block_ids, c.block_ids) == ([0, 4], [1], [2, 3])
    assert [r.new_token_ids for r in results] == [(103,), (104,), (105,)]

    planned, _, results = step(scheduler, tokens)
    assert planned == [("a", 5, 1, True), ("b", 4, 1, True), ("c", 6, 1, True)]
    assert results == [
        RequestOutput("a", (106,), FinishReason.LENGTH, 4, 0),
        RequestOutput("b", (107,), FinishReason.LENGTH, 3, 0),
        RequestOutput("c", (108,), FinishReason.LENGTH, 5, 0),
    ]
    assert (a.output_token_ids, b.output_token_ids, c.output_token_ids) == (
        [100, 103, 106],
        [101, 104, 107],
        [102, 105, 108],
    )
    assert all(r.status == RequestStatus.FINISHED for r in (a, b, c))
    # b took block 5 for its position 4; blocks return in finishing order a, b, c, each
    # request's tail first (so a cached prefix is evicted last).
    assert list(allocator.free_block_queue) == [*range(6, 16), 4, 0, 5, 1, 3, 2]
    assert_all_free(scheduler, allocator)


def test_chunked_prefill_splits_prompt_and_only_last_chunk_samples() -> None:
    scheduler, allocator = plain_scheduler(max_num_batched_tokens=4)
    request = scheduler.add_request(make_engine_request("a", range(10, 20), 4))
    tokens = token_counter()

    planned, _, results = step(scheduler, tokens)
    assert planned == [("a", 0, 4, False)]
    assert results == []
    assert request.block_ids == [0]
    assert request.num_computed_tokens == 4

    planned, _, results = step(scheduler, tokens)
    assert planned == [("a", 4, 4, False)]
    assert results == []
    assert request.block_ids == [0, 1]

    planned, _, results = step(scheduler, tokens)
    assert planned == [("a", 8, 2, True)]
    assert results == [RequestOutput("a", (100,), FinishReason.UNSPECIFIED, 10, 0)]
    assert request.block_ids == [0, 1, 2]
    assert request.num_computed_tokens == 10

    for num_computed in (10, 11):
        planned, _, _ = step(scheduler, tokens)
        assert planned == [("a", num_computed, 1, True)]
        assert request.block_ids == [0, 1, 2]

    output = scheduler.schedule()
    assert plan(output) == [("a", 12, 1, True)]
    assert request.block_ids == [0, 1, 2, 3]  # position 12 starts a fourth block
    results = scheduler.update(output, [next(tokens)])
    assert results == [RequestOutput("a", (103,), FinishReason.LENGTH, 10, 0)]
    assert request.output_token_ids == [100, 101, 102, 103]
    assert_all_free(scheduler, allocator)


def test_token_budget_is_shared_between_decodes_and_a_prefill_chunk() -> None:
    scheduler, allocator = plain_scheduler(max_num_batched_tokens=8)
    a = scheduler.add_request(make_engine_request("a", range(10, 16), 2))
    b = scheduler.add_request(make_engine_request("b", range(10, 15), 2))
    tokens = token_counter()

    planned, _, _ = step(scheduler, tokens)
    assert planned == [("a", 0, 6, True), ("b", 0, 2, False)]
    assert (a.block_ids, b.block_ids) == ([0, 1], [2])

    planned, _, results = step(scheduler, tokens)
    assert planned == [("a", 6, 1, True), ("b", 2, 3, True)]
    assert (a.block_ids, b.block_ids) == ([], [2, 3])
    assert results == [
        RequestOutput("a", (101,), FinishReason.LENGTH, 6, 0),
        RequestOutput("b", (102,), FinishReason.UNSPECIFIED, 5, 0),
    ]

    planned, _, results = step(scheduler, tokens)
    assert planned == [("b", 5, 1, True)]
    assert results == [RequestOutput("b", (103,), FinishReason.LENGTH, 5, 0)]
    assert (a.output_token_ids, b.output_token_ids) == ([100, 101], [102, 103])
    assert_all_free(scheduler, allocator)


def test_decode_steps_schedule_one_token_per_running_request() -> None:
    scheduler, allocator = plain_scheduler()
    for request_id, num_prompt in (("a", 3), ("b", 6), ("c", 1)):
        scheduler.add_request(make_engine_request(request_id, range(10, 10 + num_prompt), 4))
    tokens = token_counter()
    step(scheduler, tokens)
    for i in range(3):
        planned, _, results = step(scheduler, tokens)
        assert planned == [("a", 3 + i, 1, True), ("b", 6 + i, 1, True), ("c", 1 + i, 1, True)]
        assert [r.new_token_ids for r in results] == [
            (103 + 3 * i,),
            (104 + 3 * i,),
            (105 + 3 * i,),
        ]
    assert [r.finish_reason for r in results] == [FinishReason.LENGTH] * 3
    assert_all_free(scheduler, allocator)


def test_max_num_seqs_limits_the_running_set() -> None:
    scheduler, allocator = plain_scheduler(max_num_seqs=2)
    for request_id in ("a", "b", "c"):
        scheduler.add_request(make_engine_request(request_id, range(10, 14), 2))
    tokens = token_counter()

    planned, _, _ = step(scheduler, tokens)
    assert planned == [("a", 0, 4, True), ("b", 0, 4, True)]
    assert [r.request_id for r in scheduler.waiting] == ["c"]

    planned, _, results = step(scheduler, tokens)
    assert planned == [("a", 4, 1, True), ("b", 4, 1, True)]
    assert [r.finish_reason for r in results] == [FinishReason.LENGTH] * 2
    assert [r.request_id for r in scheduler.waiting] == ["c"]

    # a freed [0, 2], b freed [1, 3]: c takes the front of the free queue.
    planned, _, _ = step(scheduler, tokens)
    assert planned == [("c", 0, 4, True)]
    assert scheduler.requests["c"].block_ids == [4]
    run_to_completion(scheduler, tokens)
    assert_all_free(scheduler, allocator)


def test_preemption_evicts_the_most_recently_admitted_and_recomputes_it() -> None:
    scheduler, allocator = plain_scheduler(num_blocks=6, max_num_batched_tokens=16)
    a, b, c = (scheduler.add_request(make_engine_request(r, range(10, 14), 8)) for r in "abc")
    tokens = token_counter()

    step(scheduler, tokens)
    assert (a.block_ids, b.block_ids, c.block_ids) == ([0], [1], [2])
    step(scheduler, tokens)  # position 4 of each needs a second block
    assert (a.block_ids, b.block_ids, c.block_ids) == ([0, 3], [1, 4], [2, 5])
    for _ in range(3):  # positions 5, 6, 7 fit in the second blocks
        _, preempted, _ = step(scheduler, tokens)
        assert preempted == []
    assert c.output_token_ids == [102, 105, 108, 111, 114]
    assert allocator.num_free_blocks == 0

    # Position 8 of a needs a third block: c (admitted last) is preempted; b gets c's other block.
    planned, preempted, results = step(scheduler, tokens)
    assert preempted == ["c"]
    assert planned == [("a", 8, 1, True), ("b", 8, 1, True)]
    assert [r.request_id for r in results] == ["a", "b"]
    # c's blocks [2, 5] went back tail first (5, 2): a takes 5, b takes 2.
    assert (a.block_ids, b.block_ids, c.block_ids) == ([0, 3, 5], [1, 4, 2], [])
    assert c.status == RequestStatus.PREEMPTED
    assert c.num_computed_tokens == 0
    assert c.output_token_ids == [102, 105, 108, 111, 114]
    assert list(scheduler.waiting) == [c]
    assert [r.request_id for r in scheduler.running] == ["a", "b"]
    assert scheduler.num_preemptions == 1

    # c needs 3 blocks for its 9 tokens; none are free until a and b finish.
    for num_computed in (9, 10):
        planned, _, _ = step(scheduler, tokens)
        assert planned == [("a", num_computed, 1, True), ("b", num_computed, 1, True)]
    assert a.finish_reason == b.finish_reason == FinishReason.LENGTH
    assert list(allocator.free_block_queue) == [5, 3, 0, 2, 4, 1]

    # Recompute: prompt plus the 5 output tokens in one prefill, then sample the 6th token.
    assert c.all_token_ids == [10, 11, 12, 13, 102, 105, 108, 111, 114]
    planned, _, results = step(scheduler, tokens)
    assert planned == [("c", 0, 9, True)]
    assert c.block_ids == [5, 3, 0]
    assert results == [RequestOutput("c", (121,), FinishReason.UNSPECIFIED, 4, 0)]
    assert c.status == RequestStatus.RUNNING

    planned, _, _ = step(scheduler, tokens)
    assert planned == [("c", 9, 1, True)]
    planned, _, results = step(scheduler, tokens)
    assert planned == [("c", 10, 1, True)]
    assert results == [RequestOutput("c", (123,), FinishReason.LENGTH, 4, 0)]
    assert c.output_token_ids == [102, 105, 108, 111, 114, 121, 122, 123]
    assert scheduler.num_preemptions == 1
    assert_all_free(scheduler, allocator)


def test_a_request_that_cannot_grow_preempts_itself_when_admitted_last() -> None:
    scheduler, allocator = plain_scheduler(num_blocks=2)
    a = scheduler.add_request(make_engine_request("a", range(10, 12), 2))
    b = scheduler.add_request(make_engine_request("b", range(10, 14), 2))
    tokens = token_counter()
    step(scheduler, tokens)
    assert (a.block_ids, b.block_ids) == ([0], [1])

    planned, preempted, results = step(scheduler, tokens)
    assert preempted == ["b"]
    assert planned == [("a", 2, 1, True)]
    assert results == [RequestOutput("a", (102,), FinishReason.LENGTH, 2, 0)]
    assert (b.status, b.num_computed_tokens, b.block_ids) == (RequestStatus.PREEMPTED, 0, [])

    planned, _, results = step(scheduler, tokens)
    assert planned == [("b", 0, 5, True)]
    assert b.block_ids == []  # it finished: [1, 0] were held for this step, then freed
    assert results == [RequestOutput("b", (103,), FinishReason.LENGTH, 4, 0)]
    assert b.output_token_ids == [101, 103]
    assert list(allocator.free_block_queue) == [0, 1]  # freed tail first
    assert_all_free(scheduler, allocator)


def test_eos_stops_a_request() -> None:
    scheduler, allocator = plain_scheduler()
    request = scheduler.add_request(make_engine_request("a", range(10, 14), 8))
    scheduler.update(scheduler.schedule(), [50])
    results = scheduler.update(scheduler.schedule(), [EOS_TOKEN_ID])
    assert results == [RequestOutput("a", (EOS_TOKEN_ID,), FinishReason.EOS, 4, 0)]
    assert request.output_token_ids == [50, EOS_TOKEN_ID]
    assert request.finish_reason == FinishReason.EOS
    assert_all_free(scheduler, allocator)


def test_ignore_eos_keeps_generating_until_max_new_tokens() -> None:
    scheduler, allocator = plain_scheduler()
    request = scheduler.add_request(make_engine_request("a", range(10, 14), 3, ignore_eos=True))
    reasons = [
        scheduler.update(scheduler.schedule(), [EOS_TOKEN_ID])[0].finish_reason for _ in range(3)
    ]
    assert reasons == [FinishReason.UNSPECIFIED, FinishReason.UNSPECIFIED, FinishReason.LENGTH]
    assert request.output_token_ids == [EOS_TOKEN_ID] * 3
    assert_all_free(scheduler, allocator)


def test_min_new_tokens_holds_eos_and_stop_ids_then_a_stop_id_finishes_with_stop() -> None:
    scheduler, allocator = plain_scheduler()
    engine_request = make_engine_request(
        "a", range(10, 14), min_new_tokens=2, stop_token_ids=(77, 78)
    )
    request = scheduler.add_request(engine_request)
    reasons = [
        scheduler.update(scheduler.schedule(), [token])[0].finish_reason
        for token in (EOS_TOKEN_ID, 78, 78)
    ]
    assert reasons == [FinishReason.UNSPECIFIED, FinishReason.UNSPECIFIED, FinishReason.STOP]
    assert request.output_token_ids == [EOS_TOKEN_ID, 78, 78]
    assert_all_free(scheduler, allocator)


def test_eos_after_min_new_tokens_finishes_with_eos() -> None:
    scheduler, allocator = plain_scheduler()
    request = scheduler.add_request(make_engine_request("a", range(10, 14), min_new_tokens=1))
    reasons = [
        scheduler.update(scheduler.schedule(), [token])[0].finish_reason
        for token in (EOS_TOKEN_ID, EOS_TOKEN_ID)
    ]
    assert reasons == [FinishReason.UNSPECIFIED, FinishReason.EOS]
    assert request.output_token_ids == [EOS_TOKEN_ID, EOS_TOKEN_ID]
    assert_all_free(scheduler, allocator)


def test_max_model_len_stops_with_length() -> None:
    scheduler, allocator = plain_scheduler(max_model_len=8)
    request = scheduler.add_request(make_engine_request("a", range(10, 16), 10))
    tokens = token_counter()
    _, _, first = step(scheduler, tokens)
    _, _, second = step(scheduler, tokens)
    assert first == [RequestOutput("a", (100,), FinishReason.UNSPECIFIED, 6, 0)]
    assert second == [RequestOutput("a", (101,), FinishReason.LENGTH, 6, 0)]
    assert request.num_tokens == 8
    assert_all_free(scheduler, allocator)


def test_abort_frees_blocks_at_once() -> None:
    scheduler, allocator = plain_scheduler()
    running = scheduler.add_request(make_engine_request("a", range(10, 19), 8))
    step(scheduler, token_counter())
    waiting = scheduler.add_request(make_engine_request("b", range(10, 14)))
    assert running.block_ids == [0, 1, 2]
    assert allocator.num_free_blocks == 13

    assert scheduler.abort_request("a") is True
    assert running.block_ids == []
    assert (running.status, running.finish_reason) == (RequestStatus.FINISHED, FinishReason.ABORT)
    assert allocator.num_free_blocks == 16
    assert list(allocator.free_block_queue)[-3:] == [2, 1, 0]  # tail first
    assert scheduler.abort_request("b") is True
    assert waiting.finish_reason == FinishReason.ABORT
    assert scheduler.abort_request("a") is False
    assert scheduler.abort_request("unknown") is False
    assert scheduler.schedule().scheduled == []
    assert_all_free(scheduler, allocator)


def test_every_sequence_that_ends_is_reported_once_with_its_reason() -> None:
    scheduler, allocator = plain_scheduler()
    ended: list[tuple[str, FinishReason, int]] = []
    scheduler.on_finished = lambda r: ended.append(
        (r.request_id, r.finish_reason, len(r.output_token_ids))
    )
    scheduler.add_request(make_engine_request("length", range(10, 14), 2))
    scheduler.add_request(make_engine_request("aborted", range(10, 19), 8))
    step(scheduler, token_counter())
    scheduler.add_request(make_engine_request("waiting", range(10, 14)))
    assert scheduler.kv.num_blocks_in_use == scheduler.kv.num_blocks_held == 1 + 3
    scheduler.abort_request("aborted")
    scheduler.abort_request("waiting")
    run_to_completion(scheduler, token_counter())
    assert ended == [
        ("aborted", FinishReason.ABORT, 1),
        ("waiting", FinishReason.ABORT, 0),
        ("length", FinishReason.LENGTH, 2),
    ]
    assert_all_free(scheduler, allocator)


def test_add_request_rejects_duplicate_request_id() -> None:
    scheduler, allocator = plain_scheduler()
    scheduler.add_request(make_engine_request("a", range(10, 14)))
    with pytest.raises(InvalidArgument) as info:
        scheduler.add_request(make_engine_request("a", range(10, 14)))
    assert info.value.field == "request_id"
    assert len(scheduler.waiting) == 1
    scheduler.abort_request("a")
    assert_all_free(scheduler, allocator)


@pytest.mark.parametrize(
    ("num_prompt_tokens", "max_new_tokens", "field"),
    [(0, 8, "prompt_token_ids"), (4, 0, "max_new_tokens"), (16, 8, "prompt"), (17, 8, "prompt")],
)
def test_add_request_rejects_invalid_fields(
    num_prompt_tokens: int, max_new_tokens: int, field: str
) -> None:
    scheduler, allocator = plain_scheduler(max_model_len=16)
    with pytest.raises(InvalidArgument) as info:
        scheduler.add_request(
            make_engine_request("a", range(10, 10 + num_prompt_tokens), max_new_tokens)
        )
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert_all_free(scheduler, allocator)


def test_add_request_accepts_prompt_one_below_max_model_len() -> None:
    scheduler, allocator = plain_scheduler(max_model_len=16)
    request = scheduler.add_request(make_engine_request("a", range(10, 25), 8))
    run_to_completion(scheduler, token_counter())
    assert (request.output_token_ids, request.finish_reason) == ([100], FinishReason.LENGTH)
    assert_all_free(scheduler, allocator)


def test_add_request_rejects_a_request_larger_than_the_whole_arena() -> None:
    scheduler, allocator = plain_scheduler(num_blocks=4)
    # 16 prompt + 4 new tokens store KV for 19 tokens (the last one is never fed back): 5 blocks
    # of 4; the arena has 4.
    with pytest.raises(ResourceExhausted) as info:
        scheduler.add_request(make_engine_request("a", range(10, 26), 4))
    assert str(info.value) == "max_new_tokens: 19 tokens of KV need 5 blocks, the arena has 4"
    with pytest.raises(ResourceExhausted) as info:
        scheduler.add_request(make_engine_request("a", range(10, 27), 1))
    assert str(info.value).startswith("prompt: 17 tokens of KV need 5 blocks")
    assert not scheduler.requests
    # Exactly the whole arena is accepted: 13 + 4 - 1 = 16 tokens of KV.
    request = scheduler.add_request(make_engine_request("b", range(10, 23), 4))
    run_to_completion(scheduler, token_counter())
    assert request.output_token_ids == [100, 101, 102, 103]
    assert_all_free(scheduler, allocator)
