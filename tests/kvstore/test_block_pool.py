"""Tests for BlockPool: free-queue order, all-or-nothing allocation, ref counts, atomic frees."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolayer.common.errors import InvalidArgument, ResourceExhausted
from zerolayer.kvstore.block_pool import BlockPool


def make_block_pool(num_blocks: int = 8) -> BlockPool:
    return BlockPool(num_blocks)


def free_queue(pool: BlockPool) -> list[int]:
    return list(pool.free_block_queue)


def test_new_pool_has_every_block_free_in_id_order() -> None:
    pool = make_block_pool(4)
    assert free_queue(pool) == [0, 1, 2, 3]
    assert pool.ref_cnt == [0, 0, 0, 0]
    assert (pool.num_free_blocks, pool.num_used_blocks) == (4, 0)


@pytest.mark.parametrize("num_blocks", [0, -1])
def test_pool_needs_a_positive_size(num_blocks: int) -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        make_block_pool(num_blocks)


def test_allocate_takes_from_the_front_of_the_free_queue() -> None:
    pool = make_block_pool(8)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate(2) == [3, 4]
    assert free_queue(pool) == [5, 6, 7]
    assert pool.ref_cnt == [1, 1, 1, 1, 1, 0, 0, 0]
    assert (pool.num_free_blocks, pool.num_used_blocks) == (3, 5)


def test_allocate_everything_then_one_more_is_exhausted() -> None:
    pool = make_block_pool(4)
    assert pool.allocate(4) == [0, 1, 2, 3]
    with pytest.raises(ResourceExhausted, match="num_blocks: 1 requested, 0 free"):
        pool.allocate(1)


def test_allocate_more_than_free_takes_nothing() -> None:
    pool = make_block_pool(8)
    pool.allocate(5)
    with pytest.raises(ResourceExhausted, match="num_blocks: 4 requested, 3 free"):
        pool.allocate(4)
    assert free_queue(pool) == [5, 6, 7]
    assert pool.ref_cnt == [1, 1, 1, 1, 1, 0, 0, 0]
    assert pool.allocate(3) == [5, 6, 7]


@pytest.mark.parametrize("num_blocks", [0, -2])
def test_allocate_zero_blocks_is_invalid(num_blocks: int) -> None:
    pool = make_block_pool(4)
    with pytest.raises(InvalidArgument, match="^num_blocks: must be > 0$") as info:
        pool.allocate(num_blocks)
    assert info.value.field == "num_blocks"
    assert free_queue(pool) == [0, 1, 2, 3]


def test_free_appends_to_the_back_in_the_order_given() -> None:
    pool = make_block_pool(6)
    assert pool.allocate(4) == [0, 1, 2, 3]
    pool.free([2, 0])
    assert free_queue(pool) == [4, 5, 2, 0]
    pool.free([3, 1])
    assert free_queue(pool) == [4, 5, 2, 0, 3, 1]
    assert pool.ref_cnt == [0] * 6
    # The next allocation follows the free order (least recently freed first).
    assert pool.allocate(5) == [4, 5, 2, 0, 3]


def test_free_empty_list_changes_nothing() -> None:
    pool = make_block_pool(3)
    pool.allocate(2)
    pool.free([])
    assert free_queue(pool) == [2]
    assert pool.ref_cnt == [1, 1, 0]


def test_shared_block_is_free_only_when_ref_cnt_reaches_zero() -> None:
    pool = make_block_pool(4)
    assert pool.allocate(2) == [0, 1]
    pool.ref_cnt[1] += 1  # a second owner (e.g. a prefix-cache hit) takes block 1
    pool.free([0, 1])
    assert pool.ref_cnt == [0, 1, 0, 0]
    assert free_queue(pool) == [2, 3, 0]
    assert (pool.num_free_blocks, pool.num_used_blocks) == (3, 1)
    pool.free([1])
    assert pool.ref_cnt == [0, 0, 0, 0]
    assert free_queue(pool) == [2, 3, 0, 1]


def test_one_batch_may_drop_several_references_of_a_block() -> None:
    pool = make_block_pool(3)
    assert pool.allocate(1) == [0]
    pool.ref_cnt[0] = 3
    pool.free([0, 0])
    assert pool.ref_cnt[0] == 1
    assert free_queue(pool) == [1, 2]
    pool.free([0])
    assert free_queue(pool) == [1, 2, 0]


def test_double_free_is_invalid_and_changes_nothing() -> None:
    pool = make_block_pool(4)
    assert pool.allocate(2) == [0, 1]
    pool.free([1])
    with pytest.raises(InvalidArgument, match="^block_ids: block 1 is not allocated$") as info:
        pool.free([1])
    assert info.value.field == "block_ids"
    assert pool.ref_cnt == [1, 0, 0, 0]
    assert free_queue(pool) == [2, 3, 1]


def test_same_id_twice_beyond_its_ref_cnt_is_invalid() -> None:
    pool = make_block_pool(4)
    assert pool.allocate(2) == [0, 1]
    with pytest.raises(InvalidArgument, match="block 0 is not allocated"):
        pool.free([0, 0])
    assert pool.ref_cnt == [1, 1, 0, 0]
    assert free_queue(pool) == [2, 3]


def test_never_allocated_block_cannot_be_freed() -> None:
    pool = make_block_pool(4)
    with pytest.raises(InvalidArgument, match="block 2 is not allocated"):
        pool.free([2])
    assert free_queue(pool) == [0, 1, 2, 3]
    assert pool.ref_cnt == [0, 0, 0, 0]


@pytest.mark.parametrize("bad_id", [-1, 4, 100])
def test_out_of_range_id_is_invalid(bad_id: int) -> None:
    pool = make_block_pool(4)
    pool.allocate(4)
    with pytest.raises(InvalidArgument, match=f"^block_ids: {bad_id} is out of range$"):
        pool.free([bad_id])
    assert pool.ref_cnt == [1, 1, 1, 1]
    assert free_queue(pool) == []


@pytest.mark.parametrize(
    "batch",
    [
        [0, 1, 9],  # out of range at the end
        [0, 7, 1],  # out of range in the middle
        [0, 1, 3],  # block 3 is free
        [2, 0, 2],  # block 2 twice, ref_cnt 1
    ],
)
def test_batch_with_one_bad_id_frees_none(batch: list[int]) -> None:
    pool = make_block_pool(5)
    assert pool.allocate(3) == [0, 1, 2]
    with pytest.raises(InvalidArgument):
        pool.free(batch)
    assert pool.ref_cnt == [1, 1, 1, 0, 0]
    assert free_queue(pool) == [3, 4]
    assert (pool.num_free_blocks, pool.num_used_blocks) == (2, 3)


@st.composite
def allocate_free_ops(draw: st.DrawFn) -> list[tuple[str, int]]:
    """("alloc", n) or ("free", k): free the k-th owner's blocks (modulo the owners alive)."""
    op = st.one_of(
        st.tuples(st.just("alloc"), st.integers(min_value=1, max_value=6)),
        st.tuples(st.just("free"), st.integers(min_value=0, max_value=1000)),
    )
    return draw(st.lists(op, max_size=40))


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(min_value=1, max_value=16), ops=allocate_free_ops())
def test_random_allocate_free_never_double_hands_out(
    num_blocks: int, ops: list[tuple[str, int]]
) -> None:
    pool = make_block_pool(num_blocks)
    owners: list[list[int]] = []
    in_use: set[int] = set()
    for kind, arg in ops:
        if kind == "alloc":
            num_free = pool.num_free_blocks
            expected = free_queue(pool)[:arg]
            if arg > num_free:
                with pytest.raises(ResourceExhausted):
                    pool.allocate(arg)
                assert pool.num_free_blocks == num_free
                continue
            block_ids = pool.allocate(arg)
            assert block_ids == expected
            assert in_use.isdisjoint(block_ids)
            in_use.update(block_ids)
            owners.append(block_ids)
        elif owners:
            block_ids = owners.pop(arg % len(owners))
            tail = free_queue(pool)
            pool.free(block_ids)
            in_use.difference_update(block_ids)
            assert free_queue(pool) == tail + block_ids
        assert pool.num_used_blocks == len(in_use)
        assert set(free_queue(pool)) == set(range(num_blocks)) - in_use
        assert [i for i, c in enumerate(pool.ref_cnt) if c] == sorted(in_use)
    for block_ids in owners:
        pool.free(block_ids)
    assert pool.num_free_blocks == num_blocks
    assert sorted(free_queue(pool)) == list(range(num_blocks))
    assert pool.ref_cnt == [0] * num_blocks


def test_reconcile_rebuilds_ref_counts_from_the_declaration() -> None:
    pool = make_block_pool(6)
    assert pool.allocate(4) == [0, 1, 2, 3]
    # The holder of blocks 0-3 died; the new one declares block 2 twice and block 5 once.
    assert pool.reconcile([2, 5, 2]) == 5
    assert pool.ref_cnt == [0, 0, 2, 0, 0, 1]
    assert list(pool.free_block_queue) == [4, 0, 1, 3]
    assert pool.reconcile([2, 2, 5]) == 0


def test_reconcile_with_a_bad_id_changes_nothing() -> None:
    pool = make_block_pool(4)
    pool.allocate(2)
    with pytest.raises(InvalidArgument, match="held_block_ids"):
        pool.reconcile([1, 9])
    assert pool.ref_cnt == [1, 1, 0, 0]
