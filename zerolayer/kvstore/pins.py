"""Pins: the kvstore's own references to a committed prefix's blocks, each with a deadline.

A pin holds one reference on every block of the longest committed prefix of a prompt's full
blocks, found as a prefix lookup finds them (chained block hashes under the prompt's cache salt,
its namespace), so the LRU never evicts them: a block with a reference is not in the free queue.
The pin belongs to the kvstore, not to an owner (scheduler), so an owner's crash, lease expiry,
unregistration or reconcile never touches it. It ends when released, or when its deadline
passes (:meth:`Pins.expire`, run before every pin call, allocation and sweep). A lookup whose hit
covers all of a pin's blocks renews the pin if it says so (``renew_on_hit``, as Anthropic's
cache refreshes an entry on every read).

Budgets keep pins from starving running requests: the distinct blocks pinned in all namespaces
stay within ``max_pinned_fraction`` of the pool, those of one namespace within
``max_pinned_fraction_per_namespace``; a pin that would pass either is refused whole (nothing is
pinned). Blocks already pinned (by an earlier pin of the same or a shorter prefix) cost nothing
again. Pins live in the kvstore's memory only: a restarted kvstore has none (see
docs/prefix-caching.md, "Pins").
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.pin import (
    PIN_NOTHING_CACHED,
    PIN_OVER_BUDGET,
    PIN_OVER_NAMESPACE_BUDGET,
    NamespacePins,
    PinResult,
    PinStats,
)
from zerolayer.kvstore.prefix_cache import PrefixCache


@dataclass
class Pin:
    """One pin: the blocks it holds (a prefix, in order) and its deadline."""

    pin_id: str
    cache_salt: str
    block_ids: tuple[int, ...]
    ttl_s: float
    """Lifetime given at pin time, seconds; a renewal without a ttl extends by this much."""
    renew_on_hit: bool
    expires_at: float
    """Deadline on the kvstore's clock, seconds."""


class Pins:
    """The kvstore's pins over its pool. Not thread-safe: the kvstore's event loop drives it,
    so a pin request's budget check and its references are one step (racing requests are served
    one after the other)."""

    def __init__(
        self,
        cache: PrefixCache,
        block_bytes: int,
        max_pinned_fraction: float,
        max_pinned_fraction_per_namespace: float,
        clock: Callable[[], float],
    ) -> None:
        """
        Args:
            cache: the pool whose blocks pins reference.
            block_bytes: bytes of one block (reported by :meth:`stats`).
            max_pinned_fraction: share of the pool's blocks all pins may hold, 0 to 1.
            max_pinned_fraction_per_namespace: share one namespace's pins may hold, 0 to 1.
            clock: seconds, monotonic (tests inject one).
        """
        self.cache = cache
        self.block_bytes = block_bytes
        self.clock = clock
        self.max_pinned_blocks = math.floor(max_pinned_fraction * cache.num_blocks)
        self.max_pinned_blocks_per_namespace = math.floor(
            max_pinned_fraction_per_namespace * cache.num_blocks
        )
        self.pins: dict[str, Pin] = {}
        self.pin_refs: Counter[int] = Counter()
        """Block id -> how many pins reference it."""
        self.namespace_blocks: dict[str, set[int]] = {}
        """Cache salt -> distinct blocks its pins hold."""
        self.num_pin_hits = 0
        self.num_pin_misses = 0
        self.num_pin_refusals = 0
        self.num_evictions_avoided = 0

    def pin(
        self, token_ids: Sequence[int], cache_salt: str, ttl_s: float, renew_on_hit: bool
    ) -> PinResult:
        """Pins the longest committed prefix of ``token_ids``' full blocks under ``cache_salt``
        for ``ttl_s`` seconds, or refuses (nothing changes): nothing of it is committed, or it
        would pass a budget.

        Raises:
            InvalidArgument: ``ttl_s`` is not a finite number > 0.
        """
        check_ttl(ttl_s)
        self.expire()
        block_ids = self.cache.find(token_ids, cache_salt)
        refusal = self._refusal(block_ids, cache_salt)
        if refusal:
            self.num_pin_refusals += 1
            return PinResult(refusal=refusal[0], message=refusal[1])
        pin = Pin(
            uuid.uuid4().hex,
            cache_salt,
            tuple(block_ids),
            ttl_s,
            renew_on_hit,
            self.clock() + ttl_s,
        )
        self.cache.incref(block_ids)
        self.pin_refs.update(block_ids)
        self.namespace_blocks.setdefault(cache_salt, set()).update(block_ids)
        self.pins[pin.pin_id] = pin
        return PinResult(pin.pin_id, len(block_ids), ttl_s)

    def _refusal(self, block_ids: list[int], cache_salt: str) -> tuple[str, str] | None:
        if not block_ids:
            return PIN_NOTHING_CACHED, "pin: no full block of the prompt is cached under its salt"
        num_new = sum(1 for b in block_ids if b not in self.pin_refs)
        num_pinned = len(self.pin_refs)
        if num_pinned + num_new > self.max_pinned_blocks:
            return PIN_OVER_BUDGET, (
                f"pin: {num_new} more block(s) would pass the pin budget: {num_pinned} of "
                f"{self.max_pinned_blocks} pinned (max_pinned_fraction)"
            )
        in_namespace = len(self.namespace_blocks.get(cache_salt, ()))
        if in_namespace + num_new > self.max_pinned_blocks_per_namespace:
            return PIN_OVER_NAMESPACE_BUDGET, (
                f"pin: {num_new} more block(s) would pass the namespace's pin budget: "
                f"{in_namespace} of {self.max_pinned_blocks_per_namespace} pinned "
                "(max_pinned_fraction_per_namespace)"
            )
        return None

    def renew(self, pin_id: str, ttl_s: float | None = None) -> float | None:
        """Moves the pin's deadline to ``ttl_s`` (default: its own ttl) from now; returns the
        seconds left, or None (a miss) if no such pin is held (expired, released, or dropped by
        a restart).

        Raises:
            InvalidArgument: ``ttl_s`` is given and not a finite number > 0.
        """
        if ttl_s is not None:
            check_ttl(ttl_s)
        self.expire()
        pin = self.pins.get(pin_id)
        if pin is None:
            self.num_pin_misses += 1
            return None
        ttl = pin.ttl_s if ttl_s is None else ttl_s
        pin.expires_at = self.clock() + ttl
        return ttl

    def release(self, pin_id: str) -> int | None:
        """Ends the pin now; returns how many blocks it held, or None (a miss) if no such pin is
        held. Its blocks stay cached (evictable once nothing else references them)."""
        self.expire()
        pin = self.pins.pop(pin_id, None)
        if pin is None:
            self.num_pin_misses += 1
            return None
        self._drop(pin)
        return len(pin.block_ids)

    def expire(self) -> int:
        """Releases every pin whose deadline passed; returns how many."""
        now = self.clock()
        lapsed = [p for p in self.pins.values() if p.expires_at <= now]
        for pin in lapsed:
            del self.pins[pin.pin_id]
            self._drop(pin)
        return len(lapsed)

    def _drop(self, pin: Pin) -> None:
        self.cache.free(list(pin.block_ids))
        self.pin_refs.subtract(pin.block_ids)
        gone = {b for b in pin.block_ids if self.pin_refs[b] <= 0}
        for block_id in gone:
            del self.pin_refs[block_id]
        blocks = self.namespace_blocks[pin.cache_salt]
        blocks -= gone
        if not blocks:
            del self.namespace_blocks[pin.cache_salt]

    def on_hit(self, cache_salt: str, hits: Sequence[int]) -> None:
        """Counts a prefix lookup's hit: each live pin of ``cache_salt`` all of whose blocks it
        covers is a pin hit, and is renewed by its ttl if ``renew_on_hit``."""
        if not hits or cache_salt not in self.namespace_blocks:
            return
        hit = set(hits)
        now = self.clock()
        for pin in self.pins.values():
            if pin.cache_salt == cache_salt and pin.block_ids[-1] in hit and pin.expires_at > now:
                self.num_pin_hits += 1
                if pin.renew_on_hit:
                    pin.expires_at = now + pin.ttl_s

    def on_owner_release(self, block_ids: Sequence[int]) -> None:
        """Counts an eviction avoided for each pinned block in ``block_ids`` (blocks an owner
        just dropped a reference to) that only pins hold now."""
        ref_cnt = self.cache.ref_cnt
        self.num_evictions_avoided += sum(
            1 for b in set(block_ids) if b in self.pin_refs and ref_cnt[b] == self.pin_refs[b]
        )

    def stats(self) -> PinStats:
        """The pins per namespace and the counters."""
        num_pins = Counter(p.cache_salt for p in self.pins.values())
        return PinStats(
            self.block_bytes,
            self.max_pinned_blocks,
            self.max_pinned_blocks_per_namespace,
            tuple(
                NamespacePins(salt, num_pins[salt], len(blocks))
                for salt, blocks in sorted(self.namespace_blocks.items())
            ),
            self.num_pin_hits,
            self.num_pin_misses,
            self.num_pin_refusals,
            self.num_evictions_avoided,
        )


def check_ttl(ttl_s: float) -> None:
    """Raises InvalidArgument (``ttl_s``) unless a finite number > 0."""
    if not (math.isfinite(ttl_s) and ttl_s > 0):
        raise InvalidArgument("ttl_s", f"{ttl_s} is not a finite number of seconds > 0")
