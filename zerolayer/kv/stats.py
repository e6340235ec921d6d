"""The kvstore's counters, as ``GetStats`` and its Prometheus endpoint report them, and what a
prefix lookup finds."""

from __future__ import annotations

from dataclasses import dataclass

from zerolayer.kv.owner import OwnerStats
from zerolayer.kv.pin import PinStats


@dataclass(frozen=True)
class PrefixLookup:
    """A request's prefix lookup, as the prefix-cache counters count it (once per admitted
    request)."""

    num_query_tokens: int
    """Tokens looked up (the request's prompt)."""
    num_hit_tokens: int
    """Of those, tokens found cached (whole blocks)."""


@dataclass(frozen=True)
class PrefixHit:
    """A prefix lookup's answer: the cached prefix's blocks, now referenced for the caller."""

    block_ids: list[int]
    """The blocks, in order (``len * block_size`` tokens are cached)."""
    num_pinned_blocks: int = 0
    """Of ``block_ids``, those a live pin holds (a pinned-prefix hit); 0 where nothing pins."""


@dataclass(frozen=True)
class KVStats:
    """Block counts and prefix-cache counters."""

    num_blocks_total: int
    num_blocks_free: int
    num_blocks_used: int
    num_blocks_cached: int
    prefix_caching_enabled: bool
    num_prefix_queries: int
    """Prefix lookups counted: one per admitted request, see :class:`PrefixLookup`."""
    num_prefix_query_tokens: int
    num_prefix_hit_tokens: int
    prefix_hit_ratio: float
    num_evictions: int
    num_owners: int = 0
    """Owners with a live lease (the default owner counts once it made a call)."""
    owners: tuple[OwnerStats, ...] = ()
    """Every owner known since the kvstore started, by id."""
    recovering: bool = False
    """The kvstore recovers from a restart: no block is handed out yet."""
    num_blocks_evictable: int = 0
    """Free blocks still findable by content (a subset of ``num_blocks_free`` and of
    ``num_blocks_cached``): used, evictable and ``num_blocks_free - num_blocks_evictable``
    partition the pool."""
    pins: PinStats = PinStats()
    """The kvstore's pins (see ``zerolayer.kvstore.pins``)."""
