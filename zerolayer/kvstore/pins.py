"""Pins: the kvstore's own references to a committed prefix's blocks, each with a deadline.

A pin holds one reference on every block of the longest committed prefix of a prompt's full
blocks, found as a prefix lookup finds them (chained block hashes under the prompt's cache salt,
its namespace), so the LRU never evicts them: a block with a reference is not in the free queue.
The pin belongs to the kvstore, not to an owner (scheduler), so an owner's crash, lease expiry,
unregistration or reconcile never touches it. It ends when released, or when its deadline
passes (:meth:`Pins.expire`, run before every pin call, lookup, allocation and sweep). A lookup
whose hit covers all of a pin's blocks renews the pin if it says so (``renew_on_hit``, as
Anthropic's cache refreshes an entry on every read).

Repeats do not pile up: a pin of exactly the blocks of a live pin of the same namespace and key
(the empty key included) renews that pin instead (same ``pin_id``, the later deadline, the longer
ttl), so however often requests pin their prompts, a namespace's live pins of one key are at most
its pinned blocks (a pin is known by its last block, whose parents are the rest).
A non-empty key names one pin per namespace (e.g. an agent session's latest turn): a new pin of
that key replaces the earlier one, released once the new one is made.

Budgets keep pins from starving running requests: the distinct blocks pinned in all namespaces
stay within ``max_pinned_fraction`` of the pool, those of one namespace within
``max_pinned_fraction_per_namespace``; a pin that would pass either is refused whole (nothing is
pinned). Blocks already pinned (by an earlier pin of the same or a shorter prefix) cost nothing
again (:mod:`zerolayer.kvstore.pinned_blocks`). Pins live in the kvstore's memory only: a
restarted kvstore has none (see docs/prefix-caching.md, "Pins").
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zerolayer.common.errors import FailedPrecondition, InvalidArgument
from zerolayer.kv.pin import MAX_PIN_KEY_BYTES, NamespacePins, PinResult, PinsReleased, PinStats
from zerolayer.kvstore.pin_clock import NOT_TESTING, OffsetClock
from zerolayer.kvstore.pinned_blocks import PinnedBlocks
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
    """Deadline on the pins' clock, seconds."""
    key: str = ""
    """Pins of its namespace with the same non-empty key replace each other; "": no key."""
    budget: str = ""
    """The namespace whose budget it counts against (a tenant's: all its salts share it)."""

    @property
    def identity(self) -> tuple[str, str, tuple[int, ...]]:
        """What a repeated pin shares with it: (namespace, key, blocks)."""
        return self.cache_salt, self.key, self.block_ids


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
        testing_clock: bool = False,
    ) -> None:
        """
        Args:
            cache: the pool whose blocks pins reference.
            block_bytes: bytes of one block (reported by :meth:`stats`).
            max_pinned_fraction: share of the pool's blocks all pins may hold, 0 to 1.
            max_pinned_fraction_per_namespace: share one namespace's pins may hold, 0 to 1.
            clock: seconds, monotonic (tests inject one).
            testing_clock: the deadlines follow ``clock`` plus an offset that
                :meth:`advance_clock` moves (``--testing-pin-clock``).
        """
        self.cache = cache
        self.block_bytes = block_bytes
        self.testing_clock = OffsetClock(clock) if testing_clock else None
        self.clock: Callable[[], float] = self.testing_clock or clock
        self.blocks = PinnedBlocks(
            cache.num_blocks, max_pinned_fraction, max_pinned_fraction_per_namespace
        )
        self.pins: dict[str, Pin] = {}
        self.by_identity: dict[tuple[str, str, tuple[int, ...]], str] = {}
        """:attr:`Pin.identity` -> the live pin's id (one per identity: a repeat renews it)."""
        self.by_key: dict[tuple[str, str], str] = {}
        """(cache salt, non-empty key) -> the namespace's live pin of that key."""
        self.by_last_block: dict[int, set[str]] = {}
        """A pin's last block -> the live pins that end there (a hit on it covers them all)."""
        self.num_pin_hits = 0
        self.num_pin_misses = 0
        self.num_pin_refusals = 0
        self.num_evictions_avoided = 0
        self.num_pins_replaced = 0
        self.num_pins_released_by_namespace = 0

    def pin(
        self,
        token_ids: Sequence[int],
        cache_salt: str,
        ttl_s: float,
        renew_on_hit: bool,
        key: str = "",
        budget_namespace: str = "",
    ) -> PinResult:
        """Pins the longest committed prefix of ``token_ids``' full blocks under ``cache_salt``
        for ``ttl_s`` seconds, or refuses (nothing changes): nothing of it is committed, or it
        would pass a budget (blocks already pinned cost nothing, those of a pin this one replaces
        included: it is released only once this one is made). The per-namespace budget is
        ``budget_namespace``'s ("": ``cache_salt``'s), shared by every pin that names it.

        A pin of exactly the blocks of a live pin with the same ``cache_salt`` and ``key`` renews
        that one instead: its ``pin_id``, the later of the two deadlines, the longer ttl, and
        renewed on hits if either asked. Otherwise, with a non-empty ``key``, the namespace's
        live pin of that key is released once this one is made (:attr:`num_pins_replaced`).

        Returns:
            The pin (``expires_in_s``: seconds until its deadline) or the refusal.

        Raises:
            InvalidArgument: ``ttl_s`` is not a finite number > 0, or ``key`` is longer than
                :data:`MAX_PIN_KEY_BYTES`.
        """
        check_ttl(ttl_s)
        check_key(key)
        self.expire()
        block_ids = tuple(self.cache.find(token_ids, cache_salt))
        same = self.by_identity.get((cache_salt, key, block_ids))
        if same is not None:
            return self._repeat(self.pins[same], ttl_s, renew_on_hit)
        budget = budget_namespace or cache_salt
        refusal = self.blocks.refusal(block_ids, budget)
        if refusal:
            self.num_pin_refusals += 1
            return PinResult(refusal=refusal[0], message=refusal[1])
        deadline = self.clock() + ttl_s
        pin = Pin(
            uuid.uuid4().hex, cache_salt, block_ids, ttl_s, renew_on_hit, deadline, key, budget
        )
        earlier = self.by_key.get((cache_salt, key)) if key else None
        self.cache.incref(block_ids)
        self.blocks.add(budget, block_ids)
        self.pins[pin.pin_id] = pin
        self.by_identity[pin.identity] = pin.pin_id
        self.by_last_block.setdefault(block_ids[-1], set()).add(pin.pin_id)
        if key:
            self.by_key[(cache_salt, key)] = pin.pin_id
        if earlier is not None:
            self._end(self.pins[earlier])
            self.num_pins_replaced += 1
        return PinResult(pin.pin_id, len(block_ids), ttl_s)

    def _repeat(self, pin: Pin, ttl_s: float, renew_on_hit: bool) -> PinResult:
        """Renews ``pin`` for a pin request of its very blocks, namespace and key."""
        now = self.clock()
        pin.expires_at = max(pin.expires_at, now + ttl_s)
        pin.ttl_s = max(pin.ttl_s, ttl_s)
        pin.renew_on_hit = pin.renew_on_hit or renew_on_hit
        return PinResult(pin.pin_id, len(pin.block_ids), pin.expires_at - now)

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
        pin = self.pins.get(pin_id)
        if pin is None:
            self.num_pin_misses += 1
            return None
        self._end(pin)
        return len(pin.block_ids)

    def release_namespaces(self, cache_salt_prefix: str) -> PinsReleased:
        """Ends every pin of the namespaces whose cache salt starts with ``cache_salt_prefix``
        ("": every pin), e.g. a removed tenant's; their blocks stay cached (evictable once
        unreferenced). Lapsed pins are released first and not counted."""
        self.expire()
        ended = [p for p in self.pins.values() if p.cache_salt.startswith(cache_salt_prefix)]
        block_ids: set[int] = set()
        for pin in ended:
            block_ids.update(pin.block_ids)
            self._end(pin)
        self.num_pins_released_by_namespace += len(ended)
        return PinsReleased(len(ended), len(block_ids))

    def advance_clock(self, advance_s: float) -> int:
        """Tests only: moves the pins' clock ``advance_s`` seconds forward, then releases every
        pin whose deadline passed; returns how many.

        Raises:
            FailedPrecondition: the pins keep the real clock (no ``--testing-pin-clock``).
            InvalidArgument: ``advance_s`` is not a finite number >= 0.
        """
        if self.testing_clock is None:
            raise FailedPrecondition(NOT_TESTING)
        self.testing_clock.advance(advance_s)
        return self.expire()

    def expire(self) -> int:
        """Releases every pin whose deadline passed; returns how many."""
        now = self.clock()
        lapsed = [p for p in self.pins.values() if p.expires_at <= now]
        for pin in lapsed:
            self._end(pin)
        return len(lapsed)

    def _end(self, pin: Pin) -> None:
        """Forgets a live pin and drops its references."""
        del self.pins[pin.pin_id]
        del self.by_identity[pin.identity]
        ending = self.by_last_block[pin.block_ids[-1]]
        ending.discard(pin.pin_id)
        if not ending:
            del self.by_last_block[pin.block_ids[-1]]
        if pin.key and self.by_key.get((pin.cache_salt, pin.key)) == pin.pin_id:
            del self.by_key[(pin.cache_salt, pin.key)]
        self.cache.free(list(pin.block_ids))
        self.blocks.remove(pin.budget, pin.block_ids)

    def on_hit(self, cache_salt: str, hits: Sequence[int]) -> None:
        """Counts a prefix lookup's hit: each live pin of ``cache_salt`` all of whose blocks it
        covers is a pin hit, and is renewed by its ttl if ``renew_on_hit``."""
        if not hits or not self.pins:
            return
        now = self.clock()
        # NOTE: a pin's blocks are a chain: a hit on its last block covers all of them
        covered = [self.pins[p] for b in set(hits) for p in self.by_last_block.get(b, ())]
        for pin in covered:
            if pin.cache_salt == cache_salt and pin.expires_at > now:
                self.num_pin_hits += 1
                if pin.renew_on_hit:
                    pin.expires_at = now + pin.ttl_s

    def on_owner_release(self, block_ids: Sequence[int]) -> None:
        """Counts an eviction avoided for each pinned block in ``block_ids`` (blocks an owner
        just dropped a reference to) that only pins hold now."""
        self.num_evictions_avoided += self.blocks.num_only_pinned(block_ids, self.cache.ref_cnt)

    def stats(self) -> PinStats:
        """The pins per budget namespace and the counters."""
        num_pins = Counter(p.budget for p in self.pins.values())
        return PinStats(
            self.block_bytes,
            self.blocks.max_pinned_blocks,
            self.blocks.max_pinned_blocks_per_namespace,
            tuple(
                NamespacePins(salt, num_pins[salt], len(blocks))
                for salt, blocks in sorted(self.blocks.namespace_blocks.items())
            ),
            self.num_pin_hits,
            self.num_pin_misses,
            self.num_pin_refusals,
            self.num_evictions_avoided,
            self.num_pins_replaced,
            self.num_pins_released_by_namespace,
        )


def check_ttl(ttl_s: float) -> None:
    """Raises InvalidArgument (``ttl_s``) unless a finite number > 0."""
    if not (math.isfinite(ttl_s) and ttl_s > 0):
        raise InvalidArgument("ttl_s", f"{ttl_s} is not a finite number of seconds > 0")


def check_key(key: str) -> None:
    """Raises InvalidArgument (``key``) if longer than :data:`MAX_PIN_KEY_BYTES` in UTF-8."""
    num_bytes = len(key.encode())
    if num_bytes > MAX_PIN_KEY_BYTES:
        raise InvalidArgument("key", f"{num_bytes} bytes, at most {MAX_PIN_KEY_BYTES}")
