"""The ends of pins besides ReleasePin (zerolayer.kvstore.pins): every pin of the namespaces whose
salt starts with a prefix (a removed tenant), the testing clock's advance (--testing-pin-clock),
and what a lookup says of the pinned blocks it hit; over the 8-block store of store_samples."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvstore.store_samples import PROMPT, Clock, cache_prompt, join, pinned_store

from zerolayer.common.errors import FailedPrecondition, InvalidArgument
from zerolayer.kv.pin import NamespacePins, PinsReleased
from zerolayer.kv.stats import PrefixHit
from zerolayer.kvstore.pin_clock import NOT_TESTING
from zerolayer.kvstore.refusals import LeaseExpired

TENANT = "tenant:1:a"


def test_a_namespace_release_ends_the_pins_of_salts_that_start_with_the_prefix(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    a = join(store, "a")
    salts = [TENANT, TENANT + ":s2", "x/" + TENANT, ""]
    assert cache_prompt(store, a, PROMPT[:8], salt=TENANT) == [0, 1]
    for i, salt in enumerate(salts[1:]):
        cache_prompt(store, a, list(range(100 + 4 * i, 104 + 4 * i)), salt=salt)
        store.pin(list(range(100 + 4 * i, 104 + 4 * i)), salt, 60.0, renew_on_hit=False)
    store.pin(PROMPT[:8], TENANT, 60.0, renew_on_hit=False)
    store.pin(PROMPT[:4], TENANT, 60.0, renew_on_hit=False)
    store.pin(PROMPT[:4], TENANT, 1.0, renew_on_hit=False, key="lapses")
    clock.now += 1.0  # a lapsed pin is released first, not counted
    assert store.pins.release_namespaces(TENANT) == PinsReleased(num_pins=3, num_blocks=3)
    pins = store.stats().pins
    assert pins.namespaces == (NamespacePins("", 1, 1), NamespacePins("x/" + TENANT, 1, 1))
    assert pins.num_pins_released_by_namespace == 3
    assert store.cache.ref_cnt[:3] == [0, 0, 0]
    assert store.lookup(PROMPT[:9], TENANT, a).block_ids == [0, 1]  # still cached
    assert store.pins.release_namespaces("") == PinsReleased(2, 2)
    assert store.pins.release_namespaces("") == PinsReleased(0, 0)
    assert (store.pins.pins, store.stats().pins.num_pins_released_by_namespace) == ({}, 5)


def test_the_testing_clock_expires_pins_by_its_advance_and_leaves_leases_alone(
    tmp_path: Path,
) -> None:
    store = pinned_store(tmp_path, Clock(), testing_pin_clock=True)
    a = join(store, "a")
    cache_prompt(store, a, PROMPT)
    pin_id = store.pin(PROMPT, "", 10.0, renew_on_hit=False).pin_id
    store.pin(PROMPT[:8], "", 20.0, renew_on_hit=False)
    assert store.pins.advance_clock(9.999) == 0
    assert store.pins.advance_clock(0.001) == 1
    assert store.pins.renew(pin_id) is None
    assert store.cache.ref_cnt[:3] == [1, 1, 0]
    assert store.pins.advance_clock(3600.0) == 1
    assert store.stats().pins.namespaces == ()
    # an hour on the pins' clock; the owner's 3 s lease and the pool's clock did not move
    assert sorted(store.allocate(8, a)) == list(range(8))
    with pytest.raises(InvalidArgument, match="^advance_s: "):
        store.pins.advance_clock(-1.0)


def test_the_clock_cannot_be_advanced_without_the_testing_setting(tmp_path: Path) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    a = join(store, "a")
    cache_prompt(store, a, PROMPT)
    store.pin(PROMPT, "", 10.0, renew_on_hit=False)
    with pytest.raises(FailedPrecondition, match=f"^{NOT_TESTING}$"):
        store.pins.advance_clock(60.0)
    assert store.stats().pins.num_blocks_pinned == 3
    clock.now += 4.0  # the real clock moves pins and leases alike
    assert store.stats().pins.num_blocks_pinned == 3
    with pytest.raises(LeaseExpired):
        store.sweep()
        store.allocate(1, a)


def test_a_lookup_says_how_many_of_its_hit_blocks_a_live_pin_holds(tmp_path: Path) -> None:
    clock = Clock()
    store = pinned_store(tmp_path, clock)
    a = join(store, "a")
    cache_prompt(store, a, PROMPT)
    cache_prompt(store, a, PROMPT, salt="other")
    pin_id = store.pin(PROMPT[:8], "", 10.0, renew_on_hit=False).pin_id
    assert store.lookup(PROMPT, "", a) == PrefixHit([0, 1, 2], num_pinned_blocks=2)
    assert store.lookup(PROMPT, "other", a) == PrefixHit([3, 4, 5], num_pinned_blocks=0)
    assert store.pins.release(pin_id) == 2
    assert store.lookup(PROMPT, "", a) == PrefixHit([0, 1, 2], num_pinned_blocks=0)
    store.pin(PROMPT, "", 10.0, renew_on_hit=False)
    assert store.lookup(PROMPT[:5], "", a) == PrefixHit([0], num_pinned_blocks=1)
    clock.now += 10.0  # lapsed, and no sweep yet: not a pinned hit
    assert store.lookup(PROMPT, "", a) == PrefixHit([0, 1, 2], num_pinned_blocks=0)
