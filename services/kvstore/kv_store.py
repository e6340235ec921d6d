"""The kvstore's domain object: the arena plus the block pool that hands out its blocks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services.common.clients import model_dtype_name
from services.common.config import KVStoreConfig
from services.common.manifest import WeightManifest
from services.common.model_config import ModelConfig
from services.kvstore.arena import Arena, ArenaLayout, blocks_for_bytes
from services.kvstore.block_pool import BlockPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVStats:
    """Block counts of the pool."""

    num_blocks_total: int
    num_blocks_free: int
    num_blocks_used: int


class KVStore:
    """Creates the arena for a model and serves block allocation over it.

    Raises:
        ValueError: kv_cache_bytes is too small for one block.
    """

    def __init__(self, config: KVStoreConfig, manifest: WeightManifest) -> None:
        model = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
        shape = ArenaLayout(
            num_layers=model.num_hidden_layers,
            num_kv_heads=model.num_key_value_heads,
            head_dim=model.head_dim,
            block_size=config.block_size,
            dtype=model_dtype_name(manifest),
            num_blocks=0,
        )
        num_blocks = blocks_for_bytes(config.kv_cache_bytes, shape)
        layout = ArenaLayout(**{**shape.__dict__, "num_blocks": num_blocks})
        self.arena = Arena(config.shm_path, layout)
        self.pool = BlockPool(num_blocks)
        log.info(
            "arena %s: %d blocks of %d tokens, %.1f MB",
            config.shm_path,
            num_blocks,
            config.block_size,
            layout.size_bytes / 1e6,
        )

    def allocate(self, num_blocks: int) -> list[int]:
        """See :meth:`BlockPool.allocate`."""
        return self.pool.allocate(num_blocks)

    def free(self, block_ids: list[int]) -> None:
        """See :meth:`BlockPool.free`."""
        self.pool.free(block_ids)

    def reconcile(self, held_block_ids: list[int]) -> int:
        """See :meth:`BlockPool.reconcile`."""
        changed = self.pool.reconcile(held_block_ids)
        if changed:
            log.warning("reconcile: %d block reference count(s) corrected", changed)
        return changed

    def stats(self) -> KVStats:
        """Current block counts."""
        return KVStats(self.pool.num_blocks, self.pool.num_free_blocks, self.pool.num_used_blocks)

    def close(self) -> None:
        """Removes the arena's shared-memory file."""
        self.arena.unlink()
