"""Pin keys (zerolayer.kvstore.pins): a repeated pin of the same blocks, namespace and key renews
the live one instead of adding another, and a non-empty key names one pin per namespace that a
later pin replaces; over the 8-block store of store_samples."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvstore.store_samples import PROMPT, Clock, cache_prompt, join, pinned_store

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import OwnerRef
from zerolayer.kv.pin import PIN_OVER_NAMESPACE_BUDGET, NamespacePins
from zerolayer.kvstore.kv_store import KVStore


def grow_to_three_blocks(store: KVStore, owner: OwnerRef, salt: str) -> None:
    """Commits PROMPT's third block after its cached first two (the next turn of a session)."""
    hits = store.lookup(PROMPT, salt, owner).block_ids
    [third] = store.allocate(1, owner)
    assert store.commit([CommitEntry(third, hits[-1], tuple(PROMPT[8:12]), salt)], owner) == 1
    store.free([*hits, third], owner)


def test_a_repeated_pin_of_the_same_blocks_renews_the_live_one(tmp_path: Path) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    a = join(store, "a")
    cache_prompt(store, a, PROMPT)
    first = store.pin(PROMPT, "", 10.0, renew_on_hit=False)
    clock.now += 5.0
    again = store.pin(PROMPT, "", 30.0, renew_on_hit=False)
    assert (again.pin_id, again.num_blocks, again.expires_in_s) == (first.pin_id, 3, 30.0)
    [pin] = store.pins.pins.values()
    assert (pin.ttl_s, pin.expires_at) == (30.0, 135.0)
    # a shorter repeat keeps the later deadline and the longer ttl; renew_on_hit if either asks
    short = store.pin(PROMPT, "", 1.0, renew_on_hit=True)
    assert (short.pin_id, short.expires_in_s) == (first.pin_id, 30.0)
    assert (pin.ttl_s, pin.expires_at, pin.renew_on_hit) == (30.0, 135.0, True)
    assert store.cache.ref_cnt[:3] == [1, 1, 1]  # one reference each, however often pinned
    # a shorter prefix or another key is another pin
    shorter = store.pin(PROMPT[:8], "", 10.0, renew_on_hit=False)
    keyed = store.pin(PROMPT, "", 10.0, renew_on_hit=False, key="session")
    assert len({first.pin_id, shorter.pin_id, keyed.pin_id}) == 3
    assert store.cache.ref_cnt[:3] == [3, 3, 2]
    assert store.stats().pins.namespaces == (NamespacePins("", 3, 3),)
    assert store.pin(PROMPT[:8], "", 10.0, renew_on_hit=False).pin_id == shorter.pin_id
    assert len(store.pins.pins) == 3


def test_a_lapsed_pin_is_not_renewed_by_a_repeat(tmp_path: Path) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    cache_prompt(store, join(store, "a"), PROMPT)
    first = store.pin(PROMPT, "", 10.0, renew_on_hit=False, key="k")
    clock.now += 10.0
    again = store.pin(PROMPT, "", 10.0, renew_on_hit=False, key="k")
    assert again.pin_id not in ("", first.pin_id)
    assert store.stats().pins.num_pins_replaced == 0  # it expired; nothing was replaced
    assert store.cache.ref_cnt[:3] == [1, 1, 1]


def test_a_keyed_pin_replaces_its_namespaces_earlier_pin_of_that_key(tmp_path: Path) -> None:
    store = pinned_store(tmp_path, Clock())
    a = join(store, "a")
    assert cache_prompt(store, a, PROMPT[:8], salt="t") == [0, 1]
    turn_1 = store.pin(PROMPT, "t", 60.0, renew_on_hit=False, key="session")
    assert turn_1.num_blocks == 2
    grow_to_three_blocks(store, a, "t")
    turn_2 = store.pin(PROMPT, "t", 60.0, renew_on_hit=False, key="session")
    assert (turn_2.num_blocks, turn_2.refusal) == (3, "")
    assert turn_2.pin_id != turn_1.pin_id
    assert list(store.pins.pins) == [turn_2.pin_id]
    assert store.cache.ref_cnt[:3] == [1, 1, 1]  # the earlier pin's references are gone
    assert store.pins.release(turn_1.pin_id) is None
    # another key, or the same key in another namespace, replaces nothing
    assert cache_prompt(store, a, list(range(100, 104)), salt="u") == [3]
    other_namespace = store.pin(list(range(100, 104)), "u", 60.0, False, key="session")
    other_key = store.pin(PROMPT[:4], "t", 60.0, renew_on_hit=False, key="other")
    assert set(store.pins.pins) == {turn_2.pin_id, other_namespace.pin_id, other_key.pin_id}
    pins = store.stats().pins
    assert pins.namespaces == (NamespacePins("t", 2, 3), NamespacePins("u", 1, 1))
    assert (pins.num_pins_replaced, pins.num_pin_misses) == (1, 1)


def test_a_replacement_costs_only_the_blocks_not_pinned_yet(tmp_path: Path) -> None:
    store = pinned_store(tmp_path, Clock(), per=3 / 8)  # 3 blocks per namespace
    a = join(store, "a")
    cache_prompt(store, a, PROMPT, salt="t")
    cache_prompt(store, a, list(range(100, 104)), salt="t")
    full = store.pin(PROMPT, "t", 60.0, renew_on_hit=False, key="s")
    assert full.num_blocks == 3  # the namespace's whole budget
    # the same blocks again: a renewal; a shorter prefix of them: a replacement that costs nothing
    assert store.pin(PROMPT, "t", 60.0, renew_on_hit=False, key="s").pin_id == full.pin_id
    shorter = store.pin(PROMPT[:8], "t", 60.0, renew_on_hit=False, key="s")
    assert (shorter.num_blocks, shorter.refusal) == (2, "")
    assert store.cache.ref_cnt[:3] == [1, 1, 0]
    longer = store.pin(PROMPT, "t", 60.0, renew_on_hit=False, key="s")  # 1 block more: fits
    assert (longer.num_blocks, store.stats().pins.num_pins_replaced) == (3, 2)
    # new blocks are checked before the earlier pin is released: over budget, it stays
    refused = store.pin(list(range(100, 104)), "t", 60.0, renew_on_hit=False, key="s")
    assert refused.refusal == PIN_OVER_NAMESPACE_BUDGET
    assert list(store.pins.pins) == [longer.pin_id]
    assert store.stats().pins.namespaces == (NamespacePins("t", 1, 3),)


def test_a_key_of_more_than_256_bytes_is_refused_naming_it(tmp_path: Path) -> None:
    store = pinned_store(tmp_path, Clock())
    cache_prompt(store, join(store, "a"), PROMPT)
    assert store.pin(PROMPT, "", 60.0, renew_on_hit=False, key="é" * 128).num_blocks == 3
    with pytest.raises(InvalidArgument, match=r"^key: 257 bytes, at most 256$"):
        store.pin(PROMPT, "", 60.0, renew_on_hit=False, key="é" * 128 + "x")
    assert len(store.pins.pins) == 1
