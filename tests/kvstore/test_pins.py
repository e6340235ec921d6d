"""Tests for pins: the kvstore's own references to a committed prefix, with a deadline and a
budget (zerolayer.kvstore.pins), over the 8-block store of store_samples."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from kvstore.store_samples import PROMPT, Clock, cache_prompt, join, make_store, pinned_store

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.pin import PIN_NOTHING_CACHED, PIN_OVER_BUDGET, PIN_OVER_NAMESPACE_BUDGET
from zerolayer.kvstore.refusals import Recovering


def test_a_pin_survives_pressure_that_evicts_everything_unpinned(tmp_path: Path) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    a = join(store, "a")
    assert cache_prompt(store, a, PROMPT) == [0, 1, 2]
    other = list(range(100, 112))
    assert cache_prompt(store, a, other) == [3, 4, 5]
    result = store.pin(PROMPT, "", ttl_s=60.0, renew_on_hit=False)
    assert (result.num_blocks, result.refusal, len(result.pin_id)) == (3, "", 32)
    assert store.cache.ref_cnt == [1, 1, 1, 0, 0, 0, 0, 0]
    # every unpinned block is taken: the other prompt's cached blocks are evicted, PROMPT's not
    assert store.allocate(5, a) == [6, 7, 3, 4, 5]
    assert store.lookup(other, "", a).block_ids == []
    assert store.lookup(PROMPT, "", a).block_ids == [0, 1, 2]


def test_a_pin_covers_the_longest_committed_prefix_of_all_full_blocks(tmp_path: Path) -> None:
    store = pinned_store(tmp_path, Clock())
    a = join(store, "a")
    cache_prompt(store, a, PROMPT[:8])  # 2 of the prompt's 3 full blocks committed
    assert store.pin(PROMPT, "", 60.0, False).num_blocks == 2
    hits = store.lookup(PROMPT, "", a).block_ids
    [third] = store.allocate(1, a)
    assert store.commit([CommitEntry(third, hits[-1], tuple(PROMPT[8:12]))], a) == 1
    store.free([*hits, third], a)
    # a prompt of exactly 12 tokens pins its third block too (a lookup would stop at 2)
    assert store.pin(PROMPT[:12], "", 60.0, False).num_blocks == 3
    refused = store.pin(list(range(200, 212)), "", 60.0, False)
    assert (refused.pin_id, refused.num_blocks, refused.refusal) == ("", 0, PIN_NOTHING_CACHED)
    assert store.stats().pins.num_pin_refusals == 1


def test_expiry_releases_the_blocks_at_the_deadline(tmp_path: Path) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    a = join(store, "a")
    cache_prompt(store, a, PROMPT)
    pin_id = store.pin(PROMPT, "", 10.0, False).pin_id
    clock.now += 9.999
    store.sweep()
    assert store.stats().pins.num_blocks_pinned == 3
    clock.now += 0.001
    store.sweep()
    assert store.stats().pins.namespaces == ()
    assert store.cache.ref_cnt[:3] == [0, 0, 0]
    assert store.pins.renew(pin_id) is None  # a miss
    assert store.stats().pins.num_pin_misses == 1
    # expired pins do not hold blocks back from an allocation, even before a sweep
    pin_id = store.pin(PROMPT, "", 10.0, False).pin_id
    clock.now += 10.0
    assert store.stats().pins.namespaces == ()  # nor from GetStats
    pin_id = store.pin(PROMPT, "", 10.0, False).pin_id
    clock.now += 10.0
    assert sorted(store.allocate(8, join(store, "b"))) == list(range(8))


def test_renew_and_renew_on_hit_move_the_deadline(tmp_path: Path) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    a = join(store, "a")
    cache_prompt(store, a, PROMPT)
    cache_prompt(store, a, list(range(100, 112)))
    quiet = store.pin(PROMPT, "", 10.0, renew_on_hit=False).pin_id
    renewing = store.pin(list(range(100, 112)), "", 10.0, renew_on_hit=True).pin_id
    clock.now += 8.0
    assert store.pins.renew(quiet, ttl_s=5.0) == 5.0  # deadline: 113
    store.free(store.lookup(list(range(100, 113)), "", a).block_ids, a)  # a hit: deadline 118
    store.free(store.lookup(PROMPT[:9], "", a).block_ids, a)  # covers 2 of 3 blocks: not a pin hit
    assert store.stats().pins.num_pin_hits == 1
    clock.now += 5.0
    store.sweep()
    assert set(store.pins.pins) == {renewing}
    clock.now += 5.0
    store.sweep()
    assert store.pins.pins == {}
    with pytest.raises(InvalidArgument, match="ttl_s"):
        store.pin(PROMPT, "", math.nan, False)


def test_release_ends_a_pin_and_its_blocks_stay_cached(tmp_path: Path) -> None:
    store = pinned_store(tmp_path, Clock())
    a = join(store, "a")
    cache_prompt(store, a, PROMPT)
    first = store.pin(PROMPT, "", 60.0, False).pin_id
    second = store.pin(PROMPT[:8], "", 60.0, False).pin_id
    assert store.cache.ref_cnt[:3] == [2, 2, 1]
    assert store.pins.release(first) == 3
    assert store.cache.ref_cnt[:3] == [1, 1, 0]
    assert store.pins.release(first) is None
    assert store.pins.release(second) == 2
    assert store.cache.ref_cnt[:3] == [0, 0, 0]
    assert store.lookup(PROMPT, "", a).block_ids == [0, 1, 2]  # still cached
    stats = store.stats().pins
    assert (stats.num_pin_misses, stats.namespaces) == (1, ())


def test_another_namespaces_identical_prefix_is_not_pinned(tmp_path: Path) -> None:
    store = pinned_store(tmp_path, Clock())
    a = join(store, "a")
    assert cache_prompt(store, a, PROMPT, salt="tenant-a") == [0, 1, 2]
    assert cache_prompt(store, a, PROMPT, salt="tenant-b") == [3, 4, 5]
    assert store.pin(PROMPT, "tenant-a", 60.0, False).num_blocks == 3
    assert store.pin(PROMPT, "", 60.0, False).refusal == PIN_NOTHING_CACHED
    assert store.cache.ref_cnt[:6] == [1, 1, 1, 0, 0, 0]
    assert store.allocate(5, a) == [6, 7, 3, 4, 5]  # tenant-b's copy is evicted
    assert store.lookup(PROMPT, "tenant-b", a).block_ids == []
    assert [(n.cache_salt, n.num_blocks_pinned) for n in store.stats().pins.namespaces] == [
        ("tenant-a", 3)
    ]


def test_a_pin_over_the_budget_in_all_is_refused_whole(tmp_path: Path) -> None:
    store = pinned_store(tmp_path, Clock(), fraction=0.5, per=1.0)  # 4 blocks in all
    a = join(store, "a")
    cache_prompt(store, a, PROMPT, salt="x")
    cache_prompt(store, a, list(range(100, 108)), salt="y")
    assert store.pin(PROMPT, "x", 60.0, False).num_blocks == 3
    assert store.pin(PROMPT[:8], "x", 60.0, False).num_blocks == 2  # already pinned: free
    refused = store.pin(list(range(100, 108)), "y", 60.0, False)
    assert refused.refusal == PIN_OVER_BUDGET
    assert refused.message == (
        "pin: 2 more block(s) would pass the pin budget: 3 of 4 pinned (max_pinned_fraction)"
    )
    assert store.cache.ref_cnt[3:5] == [0, 0]  # nothing of it pinned
    assert store.stats().pins.num_blocks_pinned == 3


def test_a_pin_over_its_namespaces_budget_is_refused_whole(tmp_path: Path) -> None:
    store = pinned_store(tmp_path, Clock(), fraction=1.0, per=0.25)  # 2 blocks per namespace
    a = join(store, "a")
    cache_prompt(store, a, PROMPT[:8], salt="x")
    cache_prompt(store, a, PROMPT, salt="y")
    assert store.pin(PROMPT[:8], "x", 60.0, False).num_blocks == 2
    refused = store.pin(PROMPT, "y", 60.0, False)
    assert (refused.refusal, refused.num_blocks) == (PIN_OVER_NAMESPACE_BUDGET, 0)
    assert store.pin(PROMPT[:8], "y", 60.0, False).num_blocks == 2  # y's own budget


def test_salts_that_name_one_budget_namespace_share_its_budget(tmp_path: Path) -> None:
    store = pinned_store(tmp_path, Clock(), fraction=1.0, per=0.25)  # 2 blocks per namespace
    a = join(store, "a")
    cache_prompt(store, a, PROMPT[:8], salt="tenant:1:tx")
    cache_prompt(store, a, PROMPT[:8], salt="tenant:1:ty")
    assert store.pin(PROMPT[:8], "tenant:1:tx", 60.0, False, "", "tenant:1:t").num_blocks == 2
    # Another salt of the same tenant: other blocks, the same (spent) budget.
    refused = store.pin(PROMPT[:8], "tenant:1:ty", 60.0, False, "", "tenant:1:t")
    assert refused.refusal == PIN_OVER_NAMESPACE_BUDGET
    [space] = store.stats().pins.namespaces
    assert (space.cache_salt, space.num_pins, space.num_blocks_pinned) == ("tenant:1:t", 1, 2)


def test_pin_requests_racing_for_the_last_of_a_budget_get_exactly_what_fits(
    tmp_path: Path,
) -> None:
    """Eight one-block prefixes race for a 3-block budget: the event loop serves them one after
    the other, each check and its references in one step, so exactly three win."""
    store = pinned_store(tmp_path, Clock(), fraction=3 / 8, per=1.0)
    a = join(store, "a")
    prompts = [list(range(100 + 4 * i, 104 + 4 * i)) for i in range(8)]
    for prompt in prompts:
        cache_prompt(store, a, prompt)
    results = [store.pin(p, "", 60.0, False) for p in prompts]
    assert [r.refusal or "pinned" for r in results] == ["pinned"] * 3 + [PIN_OVER_BUDGET] * 5
    assert sum(store.cache.ref_cnt) == 3


def test_a_pin_belongs_to_no_owner_and_survives_its_creators_lease(tmp_path: Path) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    a = join(store, "a")
    block_ids = cache_prompt(store, a, PROMPT, free=False)
    store.pin(PROMPT, "", 60.0, False)
    clock.now += 4.0  # a's 3 s lease lapses: its references go, the pin's stay
    store.sweep()
    assert store.cache.ref_cnt[:3] == [1, 1, 1]
    b = join(store, "b")
    store.reconcile([], b)
    assert store.stats().pins.num_evictions_avoided == 3
    assert store.lookup(PROMPT, "", b).block_ids == block_ids


def test_a_restarted_kvstore_drops_every_pin(tmp_path: Path) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    a = join(store, "a")
    cache_prompt(store, a, PROMPT)
    pin_id = store.pin(PROMPT, "", 600.0, False).pin_id
    restarted = make_store(tmp_path, clock)  # same arena, a new process's memory
    assert restarted.arena.reopened
    with pytest.raises(Recovering):
        restarted.pin(PROMPT, "", 600.0, False)
    assert restarted.stats().pins.namespaces == ()
    assert restarted.pins.renew(pin_id) is None
    a = join(restarted, "a")
    clock.now += 3.0  # the recovery window
    assert (
        restarted.lookup(PROMPT, "", a).block_ids == []
    )  # the index went too: nothing to point at
    assert sorted(restarted.allocate(8, a)) == list(range(8))
