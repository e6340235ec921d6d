"""Tests for OwnerRefs: references counted per owner over the prefix cache, whose ref_cnt is their
sum; frees and reconciles touch only the caller's references; the prefix index is shared."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.commit import CommitEntry
from zerolayer.kvstore.block_pool import BlockPool
from zerolayer.kvstore.owner_refs import OwnerRefs
from zerolayer.kvstore.prefix_cache import PrefixCache

BLOCK_SIZE = 4
PROMPT = list(range(10, 23))
"""13 tokens: three full blocks within the first 12."""


def make_refs(num_blocks: int = 8) -> OwnerRefs:
    return OwnerRefs(PrefixCache(BlockPool(num_blocks), BLOCK_SIZE, "model-a"))


def free_queue(refs: OwnerRefs) -> list[int]:
    return list(refs.cache.pool.free_block_queue)


def commit_prompt(refs: OwnerRefs, owner_id: str, block_ids: list[int]) -> int:
    entries = [
        CommitEntry(b, block_ids[i - 1] if i else None, tuple(PROMPT[i * 4 : i * 4 + 4]))
        for i, b in enumerate(block_ids)
    ]
    return refs.commit(owner_id, entries)


def test_ref_cnt_is_the_sum_of_the_owners_references() -> None:
    refs = make_refs()
    assert refs.allocate("a", 3) == [0, 1, 2]
    assert refs.allocate("b", 2) == [3, 4]
    assert commit_prompt(refs, "a", [0, 1, 2]) == 3
    assert refs.lookup("b", PROMPT, "") == [0, 1, 2]
    assert refs.lookup("a", PROMPT, "") == [0, 1, 2]
    assert refs.cache.pool.ref_cnt == [3, 3, 3, 1, 1, 0, 0, 0]
    assert refs.held("a") == {0: 2, 1: 2, 2: 2}
    assert refs.held("b") == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1}
    assert (refs.num_blocks_held("a"), refs.num_blocks_held("b")) == (3, 5)


def test_freeing_a_block_the_owner_does_not_hold_is_invalid_and_changes_nothing() -> None:
    refs = make_refs()
    assert refs.allocate("a", 2) == [0, 1]
    assert refs.allocate("b", 1) == [2]
    with pytest.raises(InvalidArgument, match="^block_ids: block 0 is not held by owner 'b'$"):
        refs.free("b", [2, 0])
    with pytest.raises(InvalidArgument, match="^block_ids: block 1 is not held by owner 'a'$"):
        refs.free("a", [1, 1])
    with pytest.raises(InvalidArgument, match="^block_ids: 9 is out of range$"):
        refs.free("a", [9])
    with pytest.raises(InvalidArgument, match="block 2 is not held by the default owner"):
        refs.free("", [2])
    assert refs.cache.pool.ref_cnt[:4] == [1, 1, 1, 0]
    assert (refs.held("a"), refs.held("b")) == ({0: 1, 1: 1}, {2: 1})
    refs.free("a", [1, 0])
    assert free_queue(refs) == [3, 4, 5, 6, 7, 1, 0]
    assert refs.held("a") == {}


def test_a_block_two_owners_hold_is_free_once_both_freed_it() -> None:
    refs = make_refs(4)
    assert refs.allocate("a", 2) == [0, 1]
    commit_prompt(refs, "a", [0])
    assert refs.lookup("b", PROMPT[:5], "") == [0]
    refs.free("a", [1, 0])
    assert (refs.cache.pool.ref_cnt, free_queue(refs)) == ([1, 0, 0, 0], [2, 3, 1])
    refs.free("b", [0])
    assert free_queue(refs) == [2, 3, 1, 0]


def test_reconcile_rebuilds_only_the_callers_references() -> None:
    refs = make_refs()
    assert refs.allocate("a", 3) == [0, 1, 2]
    assert refs.allocate("b", 2) == [3, 4]
    commit_prompt(refs, "a", [0])
    assert refs.lookup("b", PROMPT[:5], "") == [0]
    # b's scheduler restarted holding nothing but block 4, twice, and block 6.
    assert refs.reconcile("b", [4, 6, 4]) == 4
    assert refs.cache.pool.ref_cnt == [1, 1, 1, 0, 2, 0, 1, 0]
    assert free_queue(refs) == [5, 7, 3]
    assert refs.held("a") == {0: 1, 1: 1, 2: 1}
    assert refs.held("b") == {4: 2, 6: 1}
    assert refs.reconcile("b", [6, 4, 4]) == 0


def test_reconcile_with_a_bad_id_changes_nothing() -> None:
    refs = make_refs(4)
    assert refs.allocate("a", 2) == [0, 1]
    with pytest.raises(InvalidArgument, match="^held_block_ids: 4 is out of range$"):
        refs.reconcile("a", [1, 4])
    assert (refs.held("a"), refs.cache.pool.ref_cnt) == ({0: 1, 1: 1}, [1, 1, 0, 0])


def test_release_frees_the_owners_blocks_in_id_order_and_keeps_them_cached() -> None:
    refs = make_refs(6)
    assert refs.allocate("b", 1) == [0]
    assert refs.allocate("a", 4) == [1, 2, 3, 4]
    commit_prompt(refs, "a", [3, 1, 4])
    assert refs.lookup("b", PROMPT, "") == [3, 1, 4]
    assert refs.release("a") == 4
    assert free_queue(refs) == [5, 2]
    assert refs.cache.pool.ref_cnt == [1, 1, 0, 1, 1, 0]
    assert refs.release("b") == 4
    assert free_queue(refs) == [5, 2, 0, 1, 3, 4]
    assert refs.lookup("c", PROMPT, "") == [3, 1, 4]  # still cached after both went away
    assert refs.release("nobody") == 0


def test_only_a_holder_commits_a_block() -> None:
    refs = make_refs()
    assert refs.allocate("a", 1) == [0]
    with pytest.raises(InvalidArgument, match="^block_id: block 0 is not held by owner 'b'$"):
        commit_prompt(refs, "b", [0])
    assert refs.cache.num_cached_blocks == 0


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["alloc", "free", "reconcile", "release", "lookup"]),
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 5),
        ),
        max_size=40,
    )
)
def test_random_operations_keep_ref_cnt_the_sum_of_the_owners(ops) -> None:
    refs = make_refs()
    commit_owner = "seed"
    assert refs.allocate(commit_owner, 3) == [0, 1, 2]
    commit_prompt(refs, commit_owner, [0, 1, 2])
    refs.release(commit_owner)
    for kind, owner_id, n in ops:
        held = sorted(_elements(refs, owner_id))
        if kind == "alloc" and 0 < n <= refs.cache.pool.num_free_blocks:
            refs.allocate(owner_id, n)
        elif kind == "free" and held:
            refs.free(owner_id, held[: n + 1])
        elif kind == "reconcile":
            refs.reconcile(owner_id, held[n:])
        elif kind == "release":
            refs.release(owner_id)
        elif kind == "lookup":
            refs.lookup(owner_id, PROMPT[: 4 * n + 1], "")
        totals = [0] * 8
        for o in ("a", "b", "c"):
            for block_id, count in refs.held(o).items():
                totals[block_id] += count
        assert refs.cache.pool.ref_cnt == totals
        assert set(free_queue(refs)) == {b for b in range(8) if totals[b] == 0}


def _elements(refs: OwnerRefs, owner_id: str) -> list[int]:
    return [b for b, count in refs.held(owner_id).items() for _ in range(count)]
