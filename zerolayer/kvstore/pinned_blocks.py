"""The blocks pins hold, counted once however many pins share them, and the budgets they are held
to: the distinct blocks pinned in all namespaces within ``max_pinned_fraction`` of the pool, those
of one namespace within ``max_pinned_fraction_per_namespace`` (see :mod:`zerolayer.kvstore.pins`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from zerolayer.kv.pin import PIN_NOTHING_CACHED, PIN_OVER_BUDGET, PIN_OVER_NAMESPACE_BUDGET


class PinnedBlocks:
    """Per block, how many pins reference it; per namespace, the distinct blocks its pins hold;
    and whether one more pin fits the budgets."""

    def __init__(
        self,
        num_blocks: int,
        max_pinned_fraction: float,
        max_pinned_fraction_per_namespace: float,
    ) -> None:
        """
        Args:
            num_blocks: blocks of the pool.
            max_pinned_fraction: share of them all pins may hold, 0 to 1.
            max_pinned_fraction_per_namespace: share one namespace's pins may hold, 0 to 1.
        """
        self.max_pinned_blocks = math.floor(max_pinned_fraction * num_blocks)
        self.max_pinned_blocks_per_namespace = math.floor(
            max_pinned_fraction_per_namespace * num_blocks
        )
        self.pin_refs: Counter[int] = Counter()
        """Block id -> how many pins reference it."""
        self.namespace_blocks: dict[str, set[int]] = {}
        """Budget namespace (a tenant's, or a cache salt) -> distinct blocks its pins hold."""

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.pin_refs

    def refusal(self, block_ids: Sequence[int], cache_salt: str) -> tuple[str, str] | None:
        """Why a pin of ``block_ids`` in ``cache_salt``'s namespace cannot be made: (refusal,
        message in words), or None if it fits. Blocks already pinned cost nothing."""
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

    def add(self, cache_salt: str, block_ids: Iterable[int]) -> None:
        """Counts one more pin of ``block_ids`` in ``cache_salt``'s namespace."""
        block_ids = list(block_ids)
        self.pin_refs.update(block_ids)
        self.namespace_blocks.setdefault(cache_salt, set()).update(block_ids)

    def remove(self, cache_salt: str, block_ids: Iterable[int]) -> None:
        """Counts one pin of ``block_ids`` in ``cache_salt``'s namespace less."""
        block_ids = list(block_ids)
        self.pin_refs.subtract(block_ids)
        gone = {b for b in block_ids if self.pin_refs[b] <= 0}
        for block_id in gone:
            del self.pin_refs[block_id]
        blocks = self.namespace_blocks[cache_salt]
        blocks -= gone
        if not blocks:
            del self.namespace_blocks[cache_salt]

    def num_pinned(self, block_ids: Iterable[int]) -> int:
        """How many of ``block_ids`` (each counted as often as it appears) a pin holds."""
        return sum(1 for b in block_ids if b in self.pin_refs)

    def num_only_pinned(self, block_ids: Iterable[int], ref_cnt: Sequence[int]) -> int:
        """How many distinct blocks of ``block_ids`` only pins reference (their ``ref_cnt`` in
        the pool is their pins')."""
        return sum(
            1 for b in set(block_ids) if b in self.pin_refs and ref_cnt[b] == self.pin_refs[b]
        )
