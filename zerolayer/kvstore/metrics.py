"""Prometheus metrics of the kvstore, read from the store at scrape time.

``zerolayer_kv_blocks{state}`` partitions the pool: its three series sum to
``zerolayer_kv_blocks_capacity``. The prefix-cache counters count one lookup per admitted request
(when the allocation that admits it succeeds), not one per LookupPrefix call: a request waiting
for free blocks is looked up again at every engine step, and a preempted one when it is
recomputed; those repeats are not counted. No hit ratio "since start" is exported (after a long
uptime it barely moves); the ratio over a window is, in PromQL,
``rate(zerolayer_kv_prefix_hit_tokens_total[5m])
/ rate(zerolayer_kv_prefix_query_tokens_total[5m])``.

Pins are labelled by namespace as :func:`namespace_label` names it: a digest of the cache salt,
never the salt itself (a salt keeps tenants' caches apart; the metrics endpoint may be read by
others).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zerolayer.kv.pin import PinStats
from zerolayer.kvstore.kv_store import KVStore


class KVStoreCollector(Collector):
    """Exports block counts, prefix-cache counters and the owners (names prefixed
    ``zerolayer_kv_``)."""

    def __init__(self, store: KVStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        s = self._store.stats()
        blocks = GaugeMetricFamily(
            "zerolayer_kv_blocks",
            "KV blocks by state, a partition of the pool: used (referenced by a request), cached "
            "(unreferenced, findable by content, evicted when needed), free (unreferenced, empty)",
            labels=["state"],
        )
        blocks.add_metric(["used"], s.num_blocks_used)
        blocks.add_metric(["cached"], s.num_blocks_evictable)
        blocks.add_metric(["free"], s.num_blocks_free - s.num_blocks_evictable)
        yield blocks
        yield GaugeMetricFamily(
            "zerolayer_kv_blocks_capacity", "KV blocks in the arena", value=s.num_blocks_total
        )
        yield CounterMetricFamily(
            "zerolayer_kv_prefix_queries",
            "Prefix-cache lookups, one per admitted request (retries and recomputes not counted)",
            value=s.num_prefix_queries,
        )
        yield CounterMetricFamily(
            "zerolayer_kv_prefix_query_tokens",
            "Prompt tokens looked up in the prefix cache, once per admitted request",
            value=s.num_prefix_query_tokens,
        )
        yield CounterMetricFamily(
            "zerolayer_kv_prefix_hit_tokens",
            "Of those, tokens found in the prefix cache (not computed again)",
            value=s.num_prefix_hit_tokens,
        )
        yield CounterMetricFamily(
            "zerolayer_kv_evictions", "Cached blocks evicted for reuse", value=s.num_evictions
        )
        yield GaugeMetricFamily(
            "zerolayer_kv_owners", "Schedulers (owners) with a live lease", value=s.num_owners
        )
        held = GaugeMetricFamily(
            "zerolayer_kv_owner_blocks_held", "KV blocks each owner holds", labels=["owner"]
        )
        for owner in s.owners:
            held.add_metric([owner.owner_id], owner.num_blocks_held)
        yield held
        yield GaugeMetricFamily(
            "zerolayer_kv_recovering",
            "1 while a restarted kvstore waits for its owners to reconcile",
            value=int(s.recovering),
        )
        yield from pin_metrics(s.pins)


def namespace_label(cache_salt: str) -> str:
    """A namespace's metric label: ``shared`` for the empty salt, else ``ns-`` and the first 12
    hex digits of the salt's SHA-256 (stable across restarts, reveals nothing of the salt)."""
    if not cache_salt:
        return "shared"
    return "ns-" + hashlib.sha256(cache_salt.encode()).hexdigest()[:12]


def pin_metrics(pins: PinStats) -> Iterator[Metric]:
    """The pins per namespace and their counters (names prefixed ``zerolayer_kv_pin``)."""
    per_namespace = [
        GaugeMetricFamily("zerolayer_kv_pins", "Live pins per namespace", labels=["namespace"]),
        GaugeMetricFamily(
            "zerolayer_kv_pinned_blocks",
            "Distinct KV blocks held by pins, per namespace",
            labels=["namespace"],
        ),
        GaugeMetricFamily(
            "zerolayer_kv_pinned_bytes",
            "Bytes of the KV blocks held by pins, per namespace",
            labels=["namespace"],
        ),
    ]
    for n in pins.namespaces:
        label = [namespace_label(n.cache_salt)]
        values = (n.num_pins, n.num_blocks_pinned, n.num_blocks_pinned * pins.block_bytes)
        for family, value in zip(per_namespace, values, strict=True):
            family.add_metric(label, value)
    yield from per_namespace
    yield CounterMetricFamily(
        "zerolayer_kv_pin_hits",
        "Prefix lookups whose hit covered all blocks of a live pin, once per pin covered",
        value=pins.num_pin_hits,
    )
    yield CounterMetricFamily(
        "zerolayer_kv_pin_misses",
        "Renewals and releases of a pin the kvstore does not hold (expired, released, restart)",
        value=pins.num_pin_misses,
    )
    yield CounterMetricFamily(
        "zerolayer_kv_pin_refusals",
        "Pin requests refused: nothing cached, or over a budget",
        value=pins.num_pin_refusals,
    )
    yield CounterMetricFamily(
        "zerolayer_kv_pin_evictions_avoided",
        "Times the last request reference to a pinned block was dropped: unpinned, it would "
        "have become evictable",
        value=pins.num_evictions_avoided,
    )
    yield CounterMetricFamily(
        "zerolayer_kv_pins_replaced",
        "Pins released because a later pin of the same namespace and key replaced them",
        value=pins.num_pins_replaced,
    )
    yield CounterMetricFamily(
        "zerolayer_kv_pins_released_by_namespace",
        "Pins ended by a release of their namespaces (a removed tenant's)",
        value=pins.num_pins_released_by_namespace,
    )
