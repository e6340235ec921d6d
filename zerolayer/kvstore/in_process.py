"""An in-process kvstore: the engine as a library, without the kvstore layer.

The same prefix-caching block pool the kvstore serves (:class:`LocalBlockAllocator` is one),
called directly. Used by unit tests and by the ``split`` benchmark (same engine, in-process vs
through the services).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from zerolayer.common.errors import ResourceExhausted
from zerolayer.common.settings import BLOCK_SIZE, PREFIX_CACHING
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.kv.stats import PrefixHit, PrefixLookup
from zerolayer.kvstore.prefix_cache import HashFn, PrefixCache, xxh3_128


class LocalBlockAllocator(PrefixCache):
    """The scheduler's ``BlockAllocator`` in this process: the kvstore's pool and prefix cache,
    without the kvstore layer (one owner, no lease)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = BLOCK_SIZE.default,
        enable_prefix_caching: bool = PREFIX_CACHING.default,
        fingerprint: str = "local",
        hash_fn: HashFn = xxh3_128,
    ) -> None:
        super().__init__(num_blocks, block_size, fingerprint, enable_prefix_caching, hash_fn)

    @property
    def num_blocks_total(self) -> int:
        """Blocks of the pool (``BlockAllocator``'s name for :attr:`num_blocks`)."""
        return self.num_blocks

    def allocate(
        self, num_blocks: int, admitted_lookup: PrefixLookup | None = None
    ) -> list[int] | None:
        """Takes blocks (see :meth:`PrefixCache.allocate`); None when too few are free.

        Raises:
            InvalidArgument: see :meth:`PrefixCache.allocate`.
        """
        try:
            return super().allocate(num_blocks, admitted_lookup)
        except ResourceExhausted:
            return None

    def lookup(self, token_ids: Sequence[int], cache_salt: str, counted: bool = True) -> PrefixHit:  # type: ignore[override]
        """The cached prefix's blocks, referenced (see :meth:`PrefixCache.lookup`); nothing is
        pinned in this process (``num_pinned_blocks`` 0: pins are the kvstore layer's)."""
        return PrefixHit(super().lookup(token_ids, cache_salt, counted))

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
