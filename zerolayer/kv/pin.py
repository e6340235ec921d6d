"""What a pin request gets back and what the kvstore reports about its pins: the values the
kvstore's Pin, RenewPin, ReleasePin and ReleaseNamespacePins calls carry, shared by the kvstore and
its callers."""

from __future__ import annotations

from dataclasses import dataclass

PIN_NOTHING_CACHED = "pin-nothing-cached"
"""Refusal: none of the prompt's full blocks is committed under its cache salt (nothing to pin)."""
PIN_OVER_BUDGET = "pin-over-budget"
"""Refusal: the pin would take the pinned blocks of all namespaces past ``max_pinned_fraction``."""
PIN_OVER_NAMESPACE_BUDGET = "pin-over-namespace-budget"
"""Refusal: the pin would take its namespace's pinned blocks past
``max_pinned_fraction_per_namespace``."""
PIN_REFUSALS = (PIN_NOTHING_CACHED, PIN_OVER_BUDGET, PIN_OVER_NAMESPACE_BUDGET)
MAX_PIN_KEY_BYTES = 256
"""Longest pin key, bytes of UTF-8 (pins of one namespace with the same key replace each other)."""


@dataclass(frozen=True)
class PinResult:
    """A pin request's outcome: a pin (``pin_id`` set, ``refusal`` empty) or a refusal
    (``pin_id`` empty, nothing pinned, ``refusal`` one of :data:`PIN_REFUSALS`)."""

    pin_id: str = ""
    """The pin's id (32 hex digits, never reused, not even by a restarted kvstore); empty if
    refused."""
    num_blocks: int = 0
    """Blocks the pin holds: the longest committed prefix of the prompt's full blocks."""
    expires_in_s: float = 0.0
    """Seconds until the pin expires (its ttl)."""
    refusal: str = ""
    """Why nothing was pinned, one of :data:`PIN_REFUSALS`; empty for a pin."""
    message: str = ""
    """The refusal in words (the numbers of blocks asked for, pinned and allowed)."""


@dataclass(frozen=True)
class PinsReleased:
    """What a release of whole namespaces' pins ended (ReleaseNamespacePins)."""

    num_pins: int = 0
    """Pins ended."""
    num_blocks: int = 0
    """Distinct blocks they held (they stay cached, evictable once unreferenced)."""


@dataclass(frozen=True)
class NamespacePins:
    """The pins of one namespace (cache salt)."""

    cache_salt: str
    num_pins: int
    num_blocks_pinned: int
    """Distinct blocks its pins hold."""


@dataclass(frozen=True)
class PinStats:
    """The kvstore's pins and their counters since its start."""

    block_bytes: int = 0
    """Bytes of one KV block of the arena."""
    max_pinned_blocks: int = 0
    """The budget of all namespaces together, blocks."""
    max_pinned_blocks_per_namespace: int = 0
    """The budget of each namespace, blocks."""
    namespaces: tuple[NamespacePins, ...] = ()
    """Namespaces with at least one pin, by cache salt."""
    num_pin_hits: int = 0
    """Prefix lookups whose hit covered every block of a live pin (once per covered pin)."""
    num_pin_misses: int = 0
    """Renewals and releases of a pin id the kvstore does not hold (expired, released, or
    dropped by a restart)."""
    num_pin_refusals: int = 0
    """Pin requests refused (nothing cached, or over a budget)."""
    num_evictions_avoided: int = 0
    """Times an owner dropped the last request reference to a pinned block: unpinned, it would
    have joined the LRU queue, evictable; pinned, it stays."""
    num_pins_replaced: int = 0
    """Pins released because a later pin of the same namespace and key replaced them."""
    num_pins_released_by_namespace: int = 0
    """Pins ended by a release of their namespace (ReleaseNamespacePins: a removed tenant)."""

    @property
    def num_blocks_pinned(self) -> int:
        """Distinct blocks held by pins, all namespaces."""
        return sum(n.num_blocks_pinned for n in self.namespaces)
