"""Block references counted per owner over the prefix-caching block pool.

Every reference a block has belongs to one owner (a scheduler, see
:mod:`zerolayer.kvstore.owners`); the pool's ``ref_cnt`` of a block is the sum of its owners'
references. An owner frees only what it holds, reconciles only its own references, and when it
goes away (lease expired, unregistered) its references are released while the others' stay. The
prefix index is not per owner: a block one owner committed is a hit for every owner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import DEFAULT_OWNER_ID
from zerolayer.kvstore.prefix_cache import PrefixCache


def owner_name(owner_id: str) -> str:
    """How messages name an owner: ``owner 'a'``, or ``the default owner``."""
    return "the default owner" if owner_id == DEFAULT_OWNER_ID else f"owner {owner_id!r}"


class OwnerRefs:
    """A :class:`PrefixCache` whose references are counted per owner id.

    Not thread-safe (the kvstore's event loop drives it). Checks the owner's right to act are the
    caller's (:class:`zerolayer.kvstore.owners.OwnerTable`); this class only counts.
    """

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        self._held: dict[str, Counter[int]] = {}
        """Owner id -> block id -> references it holds (> 0)."""

    def held(self, owner_id: str) -> dict[int, int]:
        """The owner's references: block id -> count (a copy)."""
        return dict(self._held.get(owner_id, {}))

    def num_blocks_held(self, owner_id: str) -> int:
        """Blocks the owner holds at least one reference of."""
        return len(self._held.get(owner_id, ()))

    def allocate(self, owner_id: str, num_blocks: int) -> list[int]:
        """Takes free blocks for the owner (see :meth:`PrefixCache.allocate`).

        Raises:
            InvalidArgument: num_blocks is 0.
            ResourceExhausted: fewer free blocks than asked (nothing is taken).
        """
        block_ids = self.cache.allocate(num_blocks)
        self._add(owner_id, block_ids)
        return block_ids

    def lookup(
        self, owner_id: str, token_ids: Sequence[int], cache_salt: str, counted: bool = True
    ) -> list[int]:
        """The cached prefix's blocks, one reference each for the owner (see
        :meth:`PrefixCache.lookup`); hits may be blocks another owner committed or holds."""
        block_ids = self.cache.lookup(token_ids, cache_salt, counted)
        self._add(owner_id, block_ids)
        return block_ids

    def free(self, owner_id: str, block_ids: list[int]) -> None:
        """Drops one of the owner's references from each block, in the order given (see
        :meth:`PrefixCache.free`). All ids are checked before any is changed.

        Raises:
            InvalidArgument: an id is out of range, or names a block the owner does not hold (as
                often as it appears); nothing is changed.
        """
        self._check_range(block_ids, "block_ids")
        held = self._held.get(owner_id, Counter())
        drops = Counter(block_ids)
        for block_id in block_ids:
            if drops[block_id] > held[block_id]:
                raise InvalidArgument(
                    "block_ids", f"block {block_id} is not held by {owner_name(owner_id)}"
                )
        self.cache.free(block_ids)
        self._remove(owner_id, drops)

    def commit(self, owner_id: str, entries: Sequence[CommitEntry]) -> int:
        """Registers full blocks the owner holds (see :meth:`PrefixCache.commit`).

        Raises:
            InvalidArgument: a block the owner does not hold (nothing is registered), or a wrong
                token count.
        """
        held = self._held.get(owner_id, Counter())
        for entry in entries:
            if not held[entry.block_id]:
                raise InvalidArgument(
                    "block_id", f"block {entry.block_id} is not held by {owner_name(owner_id)}"
                )
        return self.cache.commit(entries)

    def reconcile(self, owner_id: str, held_block_ids: list[int]) -> int:
        """Rebuilds the owner's references to exactly ``held_block_ids`` (a block listed n times
        gets n); other owners' references are untouched. A block that gains its first reference
        leaves the free queue (content kept); blocks that lose their last one join the back of
        the free queue in id order.

        Returns:
            How many blocks' reference counts changed.

        Raises:
            InvalidArgument: an id is out of range (nothing is changed).
        """
        self._check_range(held_block_ids, "held_block_ids")
        old = self._held.get(owner_id, Counter())
        new = Counter(held_block_ids)
        added: list[int] = []
        removed: Counter[int] = Counter()
        for block_id in sorted(old.keys() | new.keys()):
            delta = new[block_id] - old[block_id]
            if delta > 0:
                added += [block_id] * delta
            elif delta < 0:
                removed[block_id] = -delta
        self.cache.pool.incref(added)
        self.cache.free(list(removed.elements()))
        self._add(owner_id, added)
        self._remove(owner_id, removed)
        return len(set(added)) + len(removed)

    def release(self, owner_id: str) -> int:
        """Drops every reference of the owner (it went away); its blocks stay cached, and those
        left without references join the back of the free queue in id order.

        Returns:
            How many blocks the owner held.
        """
        return self.reconcile(owner_id, [])

    def _check_range(self, block_ids: Iterable[int], field: str) -> None:
        for block_id in block_ids:
            if not 0 <= block_id < self.cache.pool.num_blocks:
                raise InvalidArgument(field, f"{block_id} is out of range")

    def _add(self, owner_id: str, block_ids: Iterable[int]) -> None:
        held = self._held.setdefault(owner_id, Counter())
        held.update(block_ids)
        if not held:
            del self._held[owner_id]

    def _remove(self, owner_id: str, drops: Counter[int]) -> None:
        held = self._held.get(owner_id)
        if held is None:
            return
        held.subtract(drops)
        for block_id in [b for b, count in held.items() if count <= 0]:
            del held[block_id]
        if not held:
            del self._held[owner_id]
