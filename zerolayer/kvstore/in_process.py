"""An in-process kvstore: the engine as a library, without the kvstore layer.

The same prefix-caching block pool the kvstore serves, called directly. Used by unit tests and by
the ``split`` benchmark (same engine, in-process vs through the services).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from zerolayer.common.errors import ResourceExhausted
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.stats import PrefixLookup
from zerolayer.kvstore.block_pool import BlockPool
from zerolayer.kvstore.prefix_cache import HashFn, PrefixCache, xxh3_128


class LocalBlockAllocator:
    """``BlockAllocator`` over a :class:`PrefixCache` in this process."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        fingerprint: str = "local",
        hash_fn: HashFn = xxh3_128,
    ) -> None:
        self.pool = BlockPool(num_blocks)
        self.cache = PrefixCache(self.pool, block_size, fingerprint, enable_prefix_caching, hash_fn)
        self.num_blocks_total = num_blocks

    def allocate(
        self, num_blocks: int, admitted_lookup: PrefixLookup | None = None
    ) -> list[int] | None:
        """Takes blocks; None when too few are free. Counts ``admitted_lookup`` when taken."""
        try:
            block_ids = self.cache.allocate(num_blocks)
        except ResourceExhausted:
            return None
        if admitted_lookup is not None:
            self.cache.stats.count(admitted_lookup)
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference from each block."""
        self.cache.free(block_ids)

    def lookup(self, token_ids: Sequence[int], cache_salt: str) -> list[int]:
        """The cached prefix's blocks, referenced; counted by the admitting :meth:`allocate`."""
        return self.cache.lookup(token_ids, cache_salt, counted=False)

    def commit(self, entries: Sequence[CommitEntry]) -> None:
        """Registers full blocks."""
        self.cache.commit(entries)

    def reconcile(self, held_block_ids: list[int]) -> int:
        """Rebuilds reference counts."""
        return self.cache.reconcile(held_block_ids)

    def lease_lost(self) -> bool:
        """False: an in-process pool has one owner, without a lease."""
        return False


def local_arena(layout: ArenaLayout, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed in-process arena tensor of ``layout.shape``.

    Zeroed by the allocator (numpy's calloc: fresh pages are zero) rather than ``torch.zeros``,
    whose parallel fill would start an OpenMP pool on the calling thread (see
    :mod:`zerolayer.scheduler.core.engine`).
    """
    num_bytes = math.prod(layout.shape) * torch.empty(0, dtype=dtype).element_size()
    raw = torch.from_numpy(np.zeros(num_bytes, dtype=np.uint8))
    return raw.view(dtype).view(layout.shape)
