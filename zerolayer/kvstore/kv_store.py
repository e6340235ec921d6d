"""The kvstore's domain object: the arena plus the prefix-caching block pool over it."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from zerolayer.common.config import KVStoreConfig
from zerolayer.common.device import fd_socket_path, resolve_device
from zerolayer.common.errors import FailedPrecondition
from zerolayer.kv.arena_info import ArenaInfo
from zerolayer.kv.arena_layout import ArenaLayout, model_arena_layout
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.stats import KVStats
from zerolayer.kvstore.arena import Arena
from zerolayer.kvstore.block_pool import BlockPool
from zerolayer.kvstore.prefix_cache import HashFn, PrefixCache, xxh3_128
from zerolayer.sharing.handle_kinds import negotiate, offered_kinds
from zerolayer.sharing.manifest import HandleKind, WeightManifest

if TYPE_CHECKING:
    from zerolayer.kvstore.device_arena import DeviceArena

log = logging.getLogger(__name__)


def arena_layout(config: KVStoreConfig, manifest: WeightManifest) -> ArenaLayout:
    """The arena geometry for the manifest's model, sized to ``config.kv_cache_bytes``."""
    return model_arena_layout(manifest, config.block_size, config.kv_cache_bytes)


def open_arena(config: KVStoreConfig, layout: ArenaLayout) -> Arena | DeviceArena:
    """The arena on ``config.device``: the shared-memory file on CPU, exportable device memory
    (the best handle kind the GPU supports) on CUDA.

    Raises:
        ArenaSizeError: ``kv_cache_bytes`` holds no block, or the arena's filesystem cannot hold
            it (checked before anything per block is built).
        ValueError: a bad ``--device``.
        RuntimeError: CUDA unusable.
    """
    if config.device == "cpu":  # resolve_device would import torch
        return Arena(config.shm_path, layout)
    device = resolve_device(config.device)
    if not device.is_cuda:
        return Arena(config.shm_path, layout)
    from zerolayer.kvstore.device_arena import DeviceArena  # torch: GPU only

    return DeviceArena(
        layout,
        device.index,
        offered_kinds(str(device))[0],
        fd_socket_path(config.address, "kvstore", os.getpid()),
        keeper=config.fd_keeper,
    )


class KVStore:
    """The arena and its blocks.

    After start the store is *unreconciled*: block operations raise FailedPrecondition until the
    scheduler declares what it holds (:meth:`reconcile`), so a restarted kvstore never hands out a
    block that a running sequence still uses.

    Raises:
        ArenaSizeError: kv_cache_bytes is too small for one block, or the arena's filesystem
            cannot hold it (raised before the block pool is built).
    """

    def __init__(
        self, config: KVStoreConfig, manifest: WeightManifest, hash_fn: HashFn = xxh3_128
    ) -> None:
        layout = arena_layout(config, manifest)
        self.arena: Arena | DeviceArena = open_arena(config, layout)
        self.cache = PrefixCache(
            BlockPool(layout.num_blocks),
            config.block_size,
            manifest.fingerprint,
            config.enable_prefix_caching,
            hash_fn,
        )
        self.reconciled = False
        log.info(
            "arena %s %s: %d blocks of %d tokens, %.1f MB, prefix caching %s",
            self.arena.path or self.arena.device,
            "reopened" if self.arena.reopened else "created",
            layout.num_blocks,
            config.block_size,
            layout.size_bytes / 1e6,
            "on" if config.enable_prefix_caching else "off",
        )

    def arena_info(self, accepted: Sequence[HandleKind]) -> ArenaInfo:
        """The arena as an importer that maps the ``accepted`` handle kinds (best first; empty:
        MMAP_FILE) sees it: the shared-memory file on CPU, the exported device memory on a GPU.

        Raises:
            FailedPrecondition: the arena's handle kind is not accepted (``accepted_handle_kinds``).
        """
        handle = getattr(self.arena, "handle", None)  # a DeviceArena's (GPU)
        offered = HandleKind.MMAP_FILE if handle is None else handle.kind
        return ArenaInfo(
            arena_id=self.arena.arena_id,
            layout=self.arena.layout,
            handle_kind=negotiate(accepted, [offered]),
            device="cpu" if handle is None else handle.device,
            shm_path=self.arena.path,
            device_memory=handle,
        )

    def _require_reconciled(self) -> None:
        if not self.reconciled:
            raise FailedPrecondition(
                "kvstore: not reconciled since start; call Reconcile with the blocks you hold first"
            )

    def allocate(self, num_blocks: int) -> list[int]:
        """See :meth:`PrefixCache.allocate`."""
        self._require_reconciled()
        return self.cache.allocate(num_blocks)

    def free(self, block_ids: list[int]) -> None:
        """See :meth:`PrefixCache.free`."""
        self._require_reconciled()
        self.cache.free(block_ids)

    def lookup(self, token_ids: Sequence[int], cache_salt: str) -> list[int]:
        """See :meth:`PrefixCache.lookup`."""
        self._require_reconciled()
        return self.cache.lookup(token_ids, cache_salt)

    def commit(self, entries: Sequence[CommitEntry]) -> int:
        """Registers full blocks; each entry carries its sequence's cache salt."""
        self._require_reconciled()
        return self.cache.commit(entries)

    def reconcile(self, held_block_ids: list[int]) -> int:
        """Rebuilds reference counts from the scheduler's declaration and opens the store."""
        changed = self.cache.reconcile(held_block_ids)
        if changed or not self.reconciled:
            # A correction means a restart lost track of blocks: worth a warning. A first
            # reconcile that changes nothing is the normal start.
            log.log(
                logging.WARNING if changed else logging.INFO,
                "reconcile: %d block(s) held by the scheduler, %d reference count(s) corrected",
                len(set(held_block_ids)),
                changed,
            )
        self.reconciled = True
        return changed

    def stats(self) -> KVStats:
        """Current counts."""
        pool, s = self.cache.pool, self.cache.stats
        return KVStats(
            pool.num_blocks,
            pool.num_free_blocks,
            pool.num_used_blocks,
            self.cache.num_cached_blocks,
            self.cache.enabled,
            s.num_queries,
            s.num_query_tokens,
            s.num_hit_tokens,
            s.hit_ratio,
            s.num_evictions,
        )

    def close(self, remove_arena: bool) -> None:
        """Removes the arena's file when ``remove_arena``; otherwise it stays for a restart."""
        if remove_arena or not self.arena.path:  # device memory cannot outlive us by name
            log.info("releasing the arena %s", self.arena.path or self.arena.device)
            self.arena.unlink()
        else:
            log.info("keeping the arena %s for a restart", self.arena.path)
