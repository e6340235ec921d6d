"""An in-process block allocator and arena: the engine as a library, without the kvstore layer.

Used by unit tests and by the ``split`` benchmark (same engine, in-process vs through services).
"""

from __future__ import annotations

import torch

from services.common.errors import ResourceExhausted
from services.kvstore.arena import ArenaLayout
from services.kvstore.block_pool import BlockPool


class LocalBlockAllocator:
    """``BlockAllocator`` over a :class:`BlockPool` in this process."""

    def __init__(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.num_blocks_total = num_blocks

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Takes blocks; None when too few are free."""
        try:
            return self.pool.allocate(num_blocks)
        except ResourceExhausted:
            return None

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference from each block."""
        self.pool.free(block_ids)


def local_arena(layout: ArenaLayout, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed in-process arena tensor of ``layout.shape``."""
    return torch.zeros(layout.shape, dtype=dtype)
