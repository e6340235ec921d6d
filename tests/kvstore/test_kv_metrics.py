"""The kvstore's Prometheus metrics: block states that partition the pool, the capacity,
prefix-cache counters that count once per admitted request, and names Prometheus' conventions
accept (base units, ``_total`` only on counters)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from kvstore.store_samples import BLOCK_BYTES, NUM_BLOCKS, PROMPT, Clock, make_store
from prometheus_client import CollectorRegistry, generate_latest

from zerolayer.common.errors import InvalidArgument, ResourceExhausted
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.stats import PrefixLookup
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.kvstore.metrics import KVStoreCollector, namespace_label


def make_registry(store: KVStore) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(KVStoreCollector(store))
    return registry


def blocks_by_state(registry: CollectorRegistry) -> dict[str, float | None]:
    return {
        state: registry.get_sample_value("zerolayer_kv_blocks", {"state": state})
        for state in ("used", "cached", "free")
    }


def commit_prompt(store: KVStore, block_ids: list[int]) -> None:
    store.commit(
        [
            CommitEntry(b, block_ids[i - 1] if i else None, tuple(PROMPT[i * 4 : i * 4 + 4]))
            for i, b in enumerate(block_ids)
        ]
    )


def store_with_cached_prompt(tmp_path: Path) -> tuple[KVStore, CollectorRegistry]:
    """A store whose blocks 0, 1, 2 hold PROMPT's first three blocks, unreferenced (free queue
    4, 5, 6, 7, 3, 2, 1, 0), and its registry."""
    store = make_store(tmp_path, Clock())
    store.reconcile([])
    assert store.allocate(4) == [0, 1, 2, 3]
    commit_prompt(store, [0, 1, 2])
    store.free([3, 2, 1, 0])
    return store, make_registry(store)


def test_block_states_partition_the_pool(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock())
    store.reconcile([])
    registry = make_registry(store)
    assert blocks_by_state(registry) == {"used": 0, "cached": 0, "free": NUM_BLOCKS}
    assert store.allocate(4) == [0, 1, 2, 3]
    commit_prompt(store, [0, 1, 2])
    assert blocks_by_state(registry) == {"used": 4, "cached": 0, "free": 4}
    store.free([3, 2, 1, 0])  # 0, 1, 2 stay findable; 3 is not (never committed)
    assert blocks_by_state(registry) == {"used": 0, "cached": 3, "free": 5}
    assert store.allocate(1) == [4]
    assert store.lookup(PROMPT[:9], "").block_ids == [0, 1]  # two cached blocks in use again
    # used: 4, 0, 1; cached (unreferenced, findable): 2; free: 3, 5, 6, 7
    assert blocks_by_state(registry) == {"used": 3, "cached": 1, "free": 4}
    assert sum(blocks_by_state(registry).values()) == NUM_BLOCKS
    assert registry.get_sample_value("zerolayer_kv_blocks_capacity") == NUM_BLOCKS
    assert store.stats().num_blocks_cached == 3  # GetStats keeps "findable, in use or free"


def test_an_evicted_block_leaves_the_cached_state(tmp_path: Path) -> None:
    store, registry = store_with_cached_prompt(tmp_path)
    assert store.allocate(6) == [4, 5, 6, 7, 3, 2]  # the last one evicts block 2
    assert blocks_by_state(registry) == {"used": 6, "cached": 2, "free": 0}
    assert registry.get_sample_value("zerolayer_kv_evictions_total") == 1


def test_names_follow_prometheus_conventions(tmp_path: Path) -> None:
    """Counters are exposed with ``_total``; no gauge ends in ``_total`` (promtool's warning);
    no ratio since start is exported (a ratio over a window is rate() / rate() in PromQL)."""
    store = make_store(tmp_path, Clock())
    registry = make_registry(store)
    types = {metric.name: metric.type for metric in registry.collect()}
    assert types == {
        "zerolayer_kv_blocks": "gauge",
        "zerolayer_kv_blocks_capacity": "gauge",
        "zerolayer_kv_prefix_queries": "counter",
        "zerolayer_kv_prefix_query_tokens": "counter",
        "zerolayer_kv_prefix_hit_tokens": "counter",
        "zerolayer_kv_evictions": "counter",
        "zerolayer_kv_owners": "gauge",
        "zerolayer_kv_owner_blocks_held": "gauge",
        "zerolayer_kv_recovering": "gauge",
        "zerolayer_kv_pins": "gauge",
        "zerolayer_kv_pinned_blocks": "gauge",
        "zerolayer_kv_pinned_bytes": "gauge",
        "zerolayer_kv_pin_hits": "counter",
        "zerolayer_kv_pin_misses": "counter",
        "zerolayer_kv_pin_refusals": "counter",
        "zerolayer_kv_pin_evictions_avoided": "counter",
        "zerolayer_kv_pins_replaced": "counter",
        "zerolayer_kv_pins_released_by_namespace": "counter",
    }
    text = generate_latest(registry).decode()
    for name, kind in types.items():
        assert not name.endswith("_total"), name
        assert (f"\n{name}_total " in text) == (kind == "counter"), name


def test_prefix_counters_count_the_admitting_allocation_not_each_lookup(tmp_path: Path) -> None:
    store, registry = store_with_cached_prompt(tmp_path)
    for _ in range(3):  # a request waiting for blocks: looked up at every step, not admitted
        assert store.lookup(PROMPT, "", counted=False).block_ids == [0, 1, 2]
        with pytest.raises(ResourceExhausted):
            store.allocate(6, admitted_lookup=PrefixLookup(len(PROMPT), 12))
        store.free([2, 1, 0])
    with pytest.raises(InvalidArgument, match="admitted_lookup"):
        store.allocate(1, admitted_lookup=PrefixLookup(4, 8))
    assert store.stats().num_blocks_free == NUM_BLOCKS  # nothing was taken
    assert store.lookup(PROMPT, "", counted=False).block_ids == [0, 1, 2]
    assert store.allocate(1, admitted_lookup=PrefixLookup(len(PROMPT), 12)) == [4]
    values = {
        name: registry.get_sample_value(f"zerolayer_kv_prefix_{name}_total")
        for name in ("queries", "query_tokens", "hit_tokens")
    }
    assert values == {"queries": 1, "query_tokens": 13, "hit_tokens": 12}
    assert store.lookup(PROMPT[:5], "").block_ids == [
        0
    ]  # a caller that does not defer: counted now
    assert store.stats().num_prefix_queries == 2
    assert store.stats().num_prefix_query_tokens == 18


def test_pins_are_exported_per_namespace_by_a_digest_of_the_salt(tmp_path: Path) -> None:
    store = make_store(tmp_path, Clock(), max_pinned_fraction=0.25)  # 2 blocks
    registry = make_registry(store)
    store.reconcile([])
    block_ids = store.allocate(3)
    commit_prompt(store, block_ids)
    store.free(block_ids)
    assert store.pin(PROMPT[:8], "", 60.0, False).num_blocks == 2
    assert store.pin(PROMPT, "", 60.0, False).refusal == "pin-over-budget"
    store.free(store.lookup(PROMPT, "").block_ids)
    assert store.pins.release("no-such-pin") is None
    shared = {"namespace": "shared"}
    assert registry.get_sample_value("zerolayer_kv_pins", shared) == 1
    assert registry.get_sample_value("zerolayer_kv_pinned_blocks", shared) == 2
    assert registry.get_sample_value("zerolayer_kv_pinned_bytes", shared) == 2 * BLOCK_BYTES
    assert registry.get_sample_value("zerolayer_kv_pin_hits_total") == 1
    assert registry.get_sample_value("zerolayer_kv_pin_misses_total") == 1
    assert registry.get_sample_value("zerolayer_kv_pin_refusals_total") == 1
    assert registry.get_sample_value("zerolayer_kv_pin_evictions_avoided_total") == 2
    assert namespace_label("tenant-a") == "ns-" + hashlib.sha256(b"tenant-a").hexdigest()[:12]
    assert b"tenant-a" not in generate_latest(registry)


def test_replaced_pins_and_namespace_releases_are_counted(tmp_path: Path) -> None:
    store, registry = store_with_cached_prompt(tmp_path)
    store.pin(PROMPT[:4], "", 60.0, False, key="session")
    store.pin(PROMPT[:8], "", 60.0, False, key="session")  # replaces the first
    store.pin(PROMPT[:8], "", 60.0, False, key="session")  # the same blocks: renews it
    store.pin(PROMPT[:4], "", 60.0, False)  # no key: another pin
    assert store.pins.release_namespaces("").num_pins == 2
    assert registry.get_sample_value("zerolayer_kv_pins_replaced_total") == 1
    assert registry.get_sample_value("zerolayer_kv_pins_released_by_namespace_total") == 2
