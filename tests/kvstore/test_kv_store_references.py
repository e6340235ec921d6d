"""Tests for the references KVStore counts per owner over its pool, whose ref_cnt is their sum;
frees and reconciles touch only the caller's references; the prefix index is shared."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvstore.store_samples import PROMPT, Clock, make_store

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import DEFAULT_OWNER, OwnerRef
from zerolayer.kvstore.kv_store import KVStore


def join(store: KVStore, owner_id: str) -> OwnerRef:
    """Registers and reconciles ``owner_id`` (holding nothing); returns what its calls carry."""
    owner = OwnerRef(owner_id, store.owners.register(owner_id).epoch)
    store.reconcile([], owner)
    return owner


def held(store: KVStore, owner: OwnerRef) -> dict[int, int]:
    return dict(store.owners.check(owner).held)


def num_blocks_held(store: KVStore) -> dict[str, int]:
    return {o.owner_id: o.num_blocks_held for o in store.stats().owners}


def free_queue(store: KVStore) -> list[int]:
    return list(store.cache.free_block_queue)


def commit_prompt(store: KVStore, owner: OwnerRef, block_ids: list[int]) -> int:
    entries = [
        CommitEntry(b, block_ids[i - 1] if i else None, tuple(PROMPT[i * 4 : i * 4 + 4]))
        for i, b in enumerate(block_ids)
    ]
    return store.commit(entries, owner)


def test_ref_cnt_is_the_sum_of_the_owners_references(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    a, b = join(store, "a"), join(store, "b")
    assert store.allocate(3, a) == [0, 1, 2]
    assert store.allocate(2, b) == [3, 4]
    assert commit_prompt(store, a, [0, 1, 2]) == 3
    assert store.lookup(PROMPT, "", b).block_ids == [0, 1, 2]
    assert store.lookup(PROMPT, "", a).block_ids == [0, 1, 2]
    assert store.cache.ref_cnt == [3, 3, 3, 1, 1, 0, 0, 0]
    assert held(store, a) == {0: 2, 1: 2, 2: 2}
    assert held(store, b) == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1}
    assert num_blocks_held(store) == {"a": 3, "b": 5}


def test_freeing_a_block_the_owner_does_not_hold_is_invalid_and_changes_nothing(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path, Clock())
    a, b = join(store, "a"), join(store, "b")
    store.reconcile([])  # the default owner
    assert store.allocate(2, a) == [0, 1]
    assert store.allocate(1, b) == [2]
    with pytest.raises(InvalidArgument, match="^block_ids: block 0 is not held by owner 'b'$"):
        store.free([2, 0], b)
    with pytest.raises(InvalidArgument, match="^block_ids: block 1 is not held by owner 'a'$"):
        store.free([1, 1], a)
    with pytest.raises(InvalidArgument, match="^block_ids: 9 is out of range$"):
        store.free([9], a)
    with pytest.raises(InvalidArgument, match="block 2 is not held by the default owner"):
        store.free([2], DEFAULT_OWNER)
    assert store.cache.ref_cnt[:4] == [1, 1, 1, 0]
    assert (held(store, a), held(store, b)) == ({0: 1, 1: 1}, {2: 1})
    store.free([1, 0], a)
    assert free_queue(store) == [3, 4, 5, 6, 7, 1, 0]
    assert held(store, a) == {}


def test_a_block_two_owners_hold_is_free_once_both_freed_it(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock(), num_blocks=4)
    a, b = join(store, "a"), join(store, "b")
    assert store.allocate(2, a) == [0, 1]
    commit_prompt(store, a, [0])
    assert store.lookup(PROMPT[:5], "", b).block_ids == [0]
    store.free([1, 0], a)
    assert (store.cache.ref_cnt, free_queue(store)) == ([1, 0, 0, 0], [2, 3, 1])
    store.free([0], b)
    assert free_queue(store) == [2, 3, 1, 0]


def test_reconcile_rebuilds_only_the_callers_references(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    a, b = join(store, "a"), join(store, "b")
    assert store.allocate(3, a) == [0, 1, 2]
    assert store.allocate(2, b) == [3, 4]
    commit_prompt(store, a, [0])
    assert store.lookup(PROMPT[:5], "", b).block_ids == [0]
    # b's scheduler restarted holding nothing but block 4, twice, and block 6.
    assert store.reconcile([4, 6, 4], b).num_blocks_changed == 4
    assert store.cache.ref_cnt == [1, 1, 1, 0, 2, 0, 1, 0]
    assert free_queue(store) == [5, 7, 3]
    assert held(store, a) == {0: 1, 1: 1, 2: 1}
    assert held(store, b) == {4: 2, 6: 1}
    assert store.reconcile([6, 4, 4], b).num_blocks_changed == 0


def test_reconcile_with_a_bad_id_changes_nothing(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock(), num_blocks=4)
    a = join(store, "a")
    assert store.allocate(2, a) == [0, 1]
    with pytest.raises(InvalidArgument, match="^held_block_ids: 4 is out of range$"):
        store.reconcile([1, 4], a)
    assert (held(store, a), store.cache.ref_cnt) == ({0: 1, 1: 1}, [1, 1, 0, 0])


def test_release_frees_the_owners_blocks_in_id_order_and_keeps_them_cached(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path, Clock(), num_blocks=6)
    a, b = join(store, "a"), join(store, "b")
    assert store.allocate(1, b) == [0]
    assert store.allocate(4, a) == [1, 2, 3, 4]
    commit_prompt(store, a, [3, 1, 4])
    assert store.lookup(PROMPT, "", b).block_ids == [3, 1, 4]
    assert store.unregister(a) == 4
    assert free_queue(store) == [5, 2]
    assert store.cache.ref_cnt == [1, 1, 0, 1, 1, 0]
    assert store.unregister(b) == 4
    assert free_queue(store) == [5, 2, 0, 1, 3, 4]
    assert store.lookup(PROMPT, "", join(store, "c")).block_ids == [
        3,
        1,
        4,
    ]  # still cached after both
    assert store.unregister(join(store, "nobody")) == 0


def test_only_a_holder_commits_a_block(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    a, b = join(store, "a"), join(store, "b")
    assert store.allocate(1, a) == [0]
    with pytest.raises(InvalidArgument, match="^block_id: block 0 is not held by owner 'b'$"):
        commit_prompt(store, b, [0])
    assert store.cache.num_cached_blocks == 0


def test_a_new_epoch_keeps_its_ids_references_until_it_reconciles(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    a = join(store, "a")
    assert store.allocate(2, a) == [0, 1]
    again = OwnerRef("a", store.owners.register("a").epoch)
    assert (held(store, again), store.cache.ref_cnt[:2]) == ({0: 1, 1: 1}, [1, 1])
    assert store.reconcile([1], again).num_blocks_changed == 1
    assert (held(store, again), store.cache.ref_cnt[:2]) == ({1: 1}, [0, 1])


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
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(Path(tmp), Clock())
        seed = join(store, "seed")
        assert store.allocate(3, seed) == [0, 1, 2]
        commit_prompt(store, seed, [0, 1, 2])
        store.unregister(seed)
        owners = {owner_id: join(store, owner_id) for owner_id in ("a", "b", "c")}
        for kind, owner_id, n in ops:
            owner = owners[owner_id]
            references = sorted(_elements(held(store, owner)))
            if kind == "alloc" and 0 < n <= store.cache.num_free_blocks:
                store.allocate(n, owner)
            elif kind == "free" and references:
                store.free(references[: n + 1], owner)
            elif kind == "reconcile":
                store.reconcile(references[n:], owner)
            elif kind == "release":
                store.unregister(owner)
                owners[owner_id] = join(store, owner_id)
            elif kind == "lookup":
                store.lookup(PROMPT[: 4 * n + 1], "", owner)
            totals = [0] * 8
            for other in owners.values():
                for block_id, count in held(store, other).items():
                    totals[block_id] += count
            assert store.cache.ref_cnt == totals
            assert set(free_queue(store)) == {b for b in range(8) if totals[b] == 0}
        store.close(remove_arena=True)


def _elements(references: dict[int, int]) -> list[int]:
    return [b for b, count in references.items() for _ in range(count)]
