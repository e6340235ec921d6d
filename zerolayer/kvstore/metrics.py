"""Prometheus metrics of the kvstore, read from the store at scrape time.

``zerolayer_kv_blocks{state}`` partitions the pool: its three series sum to
``zerolayer_kv_blocks_capacity``. The prefix-cache counters count one lookup per admitted request
(when the allocation that admits it succeeds), not one per LookupPrefix call: a request waiting
for free blocks is looked up again at every engine step, and a preempted one when it is
recomputed; those repeats are not counted. No hit ratio "since start" is exported (after a long
uptime it barely moves); the ratio over a window is, in PromQL,
``rate(zerolayer_kv_prefix_hit_tokens_total[5m])
/ rate(zerolayer_kv_prefix_query_tokens_total[5m])``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
