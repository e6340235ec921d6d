"""The kvstore's counters, as ``GetStats`` and its Prometheus endpoint report them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVStats:
    """Block counts and prefix-cache counters."""

    num_blocks_total: int
    num_blocks_free: int
    num_blocks_used: int
    num_blocks_cached: int
    prefix_caching_enabled: bool
    num_prefix_queries: int
    num_prefix_query_tokens: int
    num_prefix_hit_tokens: int
    prefix_hit_ratio: float
    num_evictions: int
