"""Tests for KVStore with several owners: per-owner references and reconciles, zombie epochs, lease
expiry (the owner that comes back), the shared prefix index, per-owner stats, and the rule that
lets a restarted kvstore hand out blocks again. Time is an injected clock; nothing sleeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvstore.store_samples import NUM_BLOCKS, PROMPT, Clock, make_store

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import DEFAULT_OWNER, OwnerRef, OwnerStats, ReconcileResult
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.kvstore.refusals import (
    EpochStale,
    LeaseExpired,
    NotReconciled,
    NotRegistered,
    Recovering,
)


def advance(store: KVStore, clock: Clock, seconds: float) -> None:
    """Moves the clock, sweeping every 0.5 s as the kvstore's loop does."""
    for _ in range(round(seconds / 0.5)):
        clock.now += 0.5
        store.sweep()


def join(store: KVStore, owner_id: str, held: list[int] | None = None) -> OwnerRef:
    """Registers and reconciles ``owner_id``; returns what its calls carry."""
    owner = OwnerRef(owner_id, store.owners.register(owner_id).epoch)
    store.reconcile(held or [], owner)
    return owner


def entries(block_ids: list[int]) -> list[CommitEntry]:
    return [
        CommitEntry(b, block_ids[i - 1] if i else None, tuple(PROMPT[i * 4 : i * 4 + 4]))
        for i, b in enumerate(block_ids)
    ]


def used(store: KVStore) -> list[int]:
    return store.cache.ref_cnt


def test_without_an_owner_a_call_is_the_default_owners_as_before(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    with pytest.raises(NotReconciled, match="the default owner has not reconciled since this"):
        store.allocate(2)
    assert store.reconcile([]) == ReconcileResult(0, False, 0.0)
    assert store.allocate(2) == [0, 1]
    store.free([1, 0])
    assert store.stats().owners == (OwnerStats("", 0, 0, None, None, False, True),)


def test_owners_hold_their_own_blocks_and_reconcile_only_their_own(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    a, b = join(store, "sched-a"), join(store, "sched-b")
    assert store.allocate(3, a) == [0, 1, 2]
    assert store.allocate(2, b) == [3, 4]
    with pytest.raises(InvalidArgument, match="block 0 is not held by owner 'sched-b'"):
        store.free([0], b)
    # A new scheduler B (same id, next epoch) declares nothing: only B's blocks are released.
    b2 = OwnerRef("sched-b", store.owners.register("sched-b").epoch)
    assert store.reconcile([], b2) == ReconcileResult(2, False, 0.0)
    assert used(store) == [1, 1, 1, 0, 0, 0, 0, 0]
    assert store.allocate(1, b2) == [5]


def test_a_zombie_epoch_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    old = join(store, "sched-a")
    assert store.allocate(2, old) == [0, 1]
    new = OwnerRef("sched-a", store.owners.register("sched-a").epoch)
    before = store.stats()
    calls = [
        lambda: store.allocate(1, old),
        lambda: store.free([0], old),
        lambda: store.lookup(PROMPT, "", old).block_ids,
        lambda: store.commit(entries([0]), old),
        lambda: store.reconcile([], old),
        lambda: store.owners.keep_alive(old),
        lambda: store.unregister(old),
    ]
    for call in calls:
        with pytest.raises(EpochStale, match="^owner 'sched-a' epoch 1: refused: the current"):
            call()
    assert store.stats() == before
    assert (new.epoch, used(store)[:3]) == (2, [1, 1, 0])


def test_a_prefix_committed_by_one_owner_is_a_hit_for_another(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    a, b = join(store, "sched-a"), join(store, "sched-b")
    assert store.allocate(4, a) == [0, 1, 2, 3]
    assert store.commit(entries([0, 1, 2]), a) == 3
    assert store.lookup(PROMPT, "", b).block_ids == [0, 1, 2]
    assert store.lookup(PROMPT, "other-tenant", b).block_ids == []
    store.free([3, 2, 1, 0], a)  # A is done; B's references keep the prefix in use
    assert used(store)[:4] == [1, 1, 1, 0]
    assert store.stats().num_prefix_hit_tokens == 12


def test_an_expired_lease_releases_the_owners_blocks_which_stay_cached(tmp_path: Path) -> None:
    clock = Clock()
    store = make_store(tmp_path, clock)
    a, b = join(store, "sched-a"), join(store, "sched-b")
    assert store.allocate(4, a) == [0, 1, 2, 3]
    assert store.commit(entries([0, 1, 2]), a) == 3
    assert store.allocate(1, b) == [4]
    advance(store, clock, 2.0)
    store.owners.keep_alive(b)
    advance(store, clock, 1.0)  # A sent nothing for 3 s (stopped, hung or dead)
    assert used(store) == [0, 0, 0, 0, 1, 0, 0, 0]
    assert list(store.cache.free_block_queue) == [5, 6, 7, 0, 1, 2, 3]
    assert store.stats().num_blocks_cached == 3
    # A comes back (SIGCONT): told its lease expired, at every call; nothing changes.
    for call in (lambda: store.allocate(1, a), lambda: store.owners.keep_alive(a)):
        with pytest.raises(LeaseExpired, match="^owner 'sched-a' epoch 1: lease expired;"):
            call()
    # It registers again, declares nothing, and finds its prefix still cached.
    a2 = join(store, "sched-a")
    assert a2.epoch == 2
    assert store.lookup(PROMPT, "", a2).block_ids == [0, 1, 2]
    assert store.allocate(2, b) == [5, 6]


def test_stats_report_every_owner(tmp_path: Path) -> None:
    clock = Clock()
    store = make_store(tmp_path, clock)
    a, b = join(store, "sched-a"), join(store, "sched-b")
    store.allocate(3, a)
    store.allocate(1, b)
    advance(store, clock, 1.0)
    store.owners.keep_alive(b)
    advance(store, clock, 2.0)
    store.reconcile([], DEFAULT_OWNER)
    stats = store.stats()
    assert (stats.num_owners, stats.recovering, stats.num_blocks_used) == (2, False, 1)
    assert stats.owners == (
        OwnerStats("", 0, 0, None, None, False, True),
        OwnerStats("sched-a", 1, 0, 0.0, 3.0, True, True),
        OwnerStats("sched-b", 1, 1, 1.0, 2.0, False, True),
    )


def test_unregister_releases_at_once(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    a = join(store, "sched-a")
    store.allocate(3, a)
    assert store.unregister(a) == 3
    assert store.stats().num_blocks_free == NUM_BLOCKS
    with pytest.raises(LeaseExpired):
        store.allocate(1, a)


def restart(tmp_path: Path, clock: Clock) -> KVStore:
    """A kvstore that holds blocks for two owners, then a new process on the same arena."""
    store = make_store(tmp_path, clock)
    a, b = join(store, "sched-a"), join(store, "sched-b")
    assert store.allocate(2, a) == [0, 1]
    assert store.allocate(3, b) == [2, 3, 4]
    return make_store(tmp_path, clock)


def test_a_restarted_kvstore_hands_out_no_block_before_every_owner_reconciled(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = restart(tmp_path, clock)
    assert store.arena.reopened and store.stats().recovering
    with pytest.raises(NotRegistered):
        store.allocate(1, OwnerRef("sched-a", 1))
    a = OwnerRef("sched-a", store.owners.register("sched-a").epoch)
    assert a.epoch == 2  # the epochs go on from the sidecar
    assert store.reconcile([1, 0], a) == ReconcileResult(2, True, 3.0)
    with pytest.raises(Recovering) as info:
        store.allocate(1, a)
    assert str(info.value) == (
        "kvstore: recovering after a restart: no block is handed out before every owner has "
        "reconciled (still waiting for: none) and the 3 s recovery window has passed (3.0 s left)"
    )
    advance(store, clock, 1.0)
    b = OwnerRef("sched-b", store.owners.register("sched-b").epoch)
    advance(store, clock, 1.5)
    store.owners.keep_alive(a)
    advance(store, clock, 0.5)  # the window passed, but B, registered, has not reconciled
    with pytest.raises(Recovering, match=r"waiting for: owner 'sched-b'\) .* \(0.0 s left\)"):
        store.allocate(1, a)
    assert store.lookup(PROMPT, "", a).block_ids == []  # a reconciled owner may look up meanwhile
    assert store.reconcile([2, 3, 4], b) == ReconcileResult(3, False, 0.0)
    assert store.allocate(3, a) == [5, 6, 7]
    assert not store.stats().recovering


def test_an_owner_that_never_reconciles_holds_up_recovery_for_one_lease_only(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = restart(tmp_path, clock)
    a = join(store, "sched-a", [0, 1])
    advance(store, clock, 0.5)
    store.owners.register("sched-b")  # and then it died
    advance(store, clock, 2.0)
    store.owners.keep_alive(a)
    advance(store, clock, 0.5)  # the window passed; B's lease has not
    with pytest.raises(Recovering, match=r"waiting for: owner 'sched-b'\)"):
        store.allocate(1, a)
    advance(store, clock, 0.5)  # B's lease expired: nobody else can hold a block
    assert store.allocate(4, a) == [2, 3, 4, 5]


def test_a_zombie_from_before_the_restart_is_still_refused(tmp_path: Path) -> None:
    clock = Clock()
    store = make_store(tmp_path, clock)
    join(store, "sched-a")
    join(store, "sched-a")
    store = make_store(tmp_path, clock)
    with pytest.raises(EpochStale, match="current epoch of owner 'sched-a' is 2"):
        store.reconcile([], OwnerRef("sched-a", 1))
    assert store.owners.register("sched-a").epoch == 3


def test_an_owner_whose_lease_expired_before_the_restart_is_told_so_after(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = make_store(tmp_path, clock)
    a = join(store, "sched-a")
    advance(store, clock, 3.0)
    store = make_store(tmp_path, clock)
    with pytest.raises(LeaseExpired):
        store.reconcile([0], a)


def test_a_new_arena_needs_no_recovery_and_keeps_the_epochs(tmp_path: Path) -> None:
    clock = Clock()
    store = make_store(tmp_path, clock)
    join(store, "sched-a")
    store.close(remove_arena=False)
    (tmp_path / "arena.kv").unlink()  # the arena is gone, its sidecar stays
    store = make_store(tmp_path, clock)
    assert not store.arena.reopened and not store.stats().recovering
    a = join(store, "sched-a")
    assert (a.epoch, store.allocate(1, a)) == (2, [0])
