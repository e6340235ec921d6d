"""The scheduler's view of KV memory: block tables of its requests over a remote block pool."""

from __future__ import annotations

from typing import Protocol

from services.scheduler.request import Request


class BlockAllocator(Protocol):
    """The operations the scheduler needs from the kvstore's block pool."""

    num_blocks_total: int

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Takes blocks with ref_cnt 1; None (nothing taken) when too few are free."""

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference from each block."""


class KVCacheManager:
    """Grows and frees the block tables of requests.

    A request's block table ``block_ids`` covers tokens ``[0, len(block_ids) * block_size)``;
    token ``p`` lives in block ``block_ids[p // block_size]`` at offset ``p % block_size``.
    """

    def __init__(self, allocator: BlockAllocator, block_size: int) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self.num_blocks_held = 0

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Makes room for the request's next ``num_new_tokens`` tokens.

        Returns:
            False if the pool has too few free blocks; the request is then unchanged.
        """
        needed = self.num_blocks_for(request.num_computed_tokens + num_new_tokens)
        missing = needed - len(request.block_ids)
        if missing <= 0:
            return True
        block_ids = self.allocator.allocate(missing)
        if block_ids is None:
            return False
        request.block_ids.extend(block_ids)
        self.num_blocks_held += len(block_ids)
        return True

    def free(self, request: Request) -> None:
        """Releases every block of the request and empties its block table."""
        if request.block_ids:
            self.allocator.free(request.block_ids)
            self.num_blocks_held -= len(request.block_ids)
            request.block_ids = []
