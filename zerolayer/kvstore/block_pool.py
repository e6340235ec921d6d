"""The block pool: fixed-size KV blocks with reference counts and a free queue.

A block is free when its ``ref_cnt`` is 0. Free blocks wait in ``free_block_queue`` in the order
they were freed, which is also the least-recently-used order the prefix cache evicts in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from zerolayer.common.errors import InvalidArgument, ResourceExhausted


class BlockPool:
    """Hands out block ids in ``[0, num_blocks)``; never the same block to two owners at once."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        # OrderedDict as an ordered set: O(1) pop from the front and removal from the middle.
        self.free_block_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt 0."""
        return len(self.free_block_queue)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref_cnt > 0."""
        return self.num_blocks - self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        """Takes ``num_blocks`` blocks from the front of the free queue, each with ref_cnt 1.

        Raises:
            InvalidArgument: num_blocks is 0.
            ResourceExhausted: fewer free blocks than asked (nothing is taken).
        """
        if num_blocks <= 0:
            raise InvalidArgument("num_blocks", "must be > 0")
        if num_blocks > self.num_free_blocks:
            raise ResourceExhausted(
                f"num_blocks: {num_blocks} requested, {self.num_free_blocks} free"
            )
        block_ids = [self.free_block_queue.popitem(last=False)[0] for _ in range(num_blocks)]
        for block_id in block_ids:
            self.ref_cnt[block_id] = 1
        return block_ids

    def check_ids(self, block_ids: Iterable[int], field_name: str = "block_ids") -> None:
        """Raises InvalidArgument (naming ``field_name``) for the first id outside
        ``[0, num_blocks)``."""
        for block_id in block_ids:
            if not 0 <= block_id < self.num_blocks:
                raise InvalidArgument(field_name, f"{block_id} is out of range")

    def incref(self, block_ids: list[int]) -> None:
        """Takes one more reference on each block; a free block leaves the free queue (it is
        reused as it is, e.g. on a prefix-cache hit).

        Raises:
            InvalidArgument: an id is out of range (nothing is changed).
        """
        self.check_ids(block_ids)
        for block_id in block_ids:
            if self.ref_cnt[block_id] == 0:
                del self.free_block_queue[block_id]
            self.ref_cnt[block_id] += 1

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference from each block; blocks reaching 0 join the back of the free queue.

        All ids are checked before any is changed.

        Raises:
            InvalidArgument: an id is out of range or names a block that is already free (or the
                same free-able reference appears twice).
        """
        drops: dict[int, int] = {}
        for block_id in block_ids:
            if not 0 <= block_id < self.num_blocks:
                raise InvalidArgument("block_ids", f"{block_id} is out of range")
            drops[block_id] = drops.get(block_id, 0) + 1
            if drops[block_id] > self.ref_cnt[block_id]:
                raise InvalidArgument("block_ids", f"block {block_id} is not allocated")
        for block_id in block_ids:
            self.ref_cnt[block_id] -= 1
            if self.ref_cnt[block_id] == 0:
                self.free_block_queue[block_id] = None

    def reconcile(self, held_block_ids: list[int]) -> int:
        """Rebuilds reference counts from the holders' declaration.

        A block listed n times gets ref_cnt n; every unlisted block becomes free (joining the back
        of the free queue, in id order). Blocks already free keep their queue position.

        Returns:
            How many blocks' ref_cnt changed.

        Raises:
            InvalidArgument: an id is out of range (nothing is changed).
        """
        self.check_ids(held_block_ids, "held_block_ids")
        counts = [0] * self.num_blocks
        for block_id in held_block_ids:
            counts[block_id] += 1
        changed = 0
        for block_id, count in enumerate(counts):
            if count == self.ref_cnt[block_id]:
                continue
            changed += 1
            self.ref_cnt[block_id] = count
            if count == 0:
                self.free_block_queue[block_id] = None
            else:
                self.free_block_queue.pop(block_id, None)
        return changed
