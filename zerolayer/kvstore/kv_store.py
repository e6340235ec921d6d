"""The kvstore's domain object: the arena plus the prefix-caching block pool over it."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from zerolayer.common.config import KVStoreConfig
from zerolayer.common.device import fd_socket_path, resolve_device
from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.arena_info import ArenaInfo
from zerolayer.kv.arena_layout import ArenaLayout, model_arena_layout
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import DEFAULT_OWNER, OwnerRef, ReconcileResult, Registration
from zerolayer.kv.stats import KVStats, PrefixLookup
from zerolayer.kvstore.arena import Arena
from zerolayer.kvstore.block_pool import BlockPool
from zerolayer.kvstore.owner_blocks import OwnerBlocks
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
    """The arena and its blocks, shared by the owners (schedulers) that register with it.

    Block calls carry the caller's :class:`OwnerRef`; the owners' registrations, epochs, leases,
    per-owner references and the restart rule are :class:`OwnerBlocks`' (see
    :mod:`zerolayer.kvstore.owners` and :mod:`zerolayer.kvstore.recovery`). Not thread-safe:
    the kvstore's event loop drives it.

    Raises:
        ArenaSizeError: kv_cache_bytes is too small for one block, or the arena's filesystem
            cannot hold it (raised before the block pool is built).
    """

    def __init__(
        self,
        config: KVStoreConfig,
        manifest: WeightManifest,
        hash_fn: HashFn = xxh3_128,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            config: the kvstore's settings (arena, block size, prefix caching, lease length).
            manifest: the loader's model (the arena's geometry and the prefix-cache fingerprint).
            hash_fn: the prefix cache's block hash (tests force collisions with it).
            clock: seconds, monotonic, for leases and the recovery window (tests inject one).
        """
        layout = arena_layout(config, manifest)
        self.arena: Arena | DeviceArena = open_arena(config, layout)
        self.cache = PrefixCache(
            BlockPool(layout.num_blocks),
            config.block_size,
            manifest.fingerprint,
            config.enable_prefix_caching,
            hash_fn,
        )
        self.blocks = OwnerBlocks(self.cache, self.arena, config.owner_lease_s, clock)
        log.info(
            "arena %s %s: %d blocks of %d tokens, %.1f MB, prefix caching %s%s",
            self.arena.path or self.arena.device,
            "reopened" if self.arena.reopened else "created",
            layout.num_blocks,
            config.block_size,
            layout.size_bytes / 1e6,
            "on" if config.enable_prefix_caching else "off",
            "; recovering: no block is handed out before the owners reconciled"
            if self.arena.reopened
            else "",
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

    def register(self, owner_id: str) -> Registration:
        """See :meth:`OwnerBlocks.register`."""
        return self.blocks.register(owner_id)

    def keep_alive(self, owner: OwnerRef) -> float:
        """See :meth:`OwnerBlocks.keep_alive`."""
        return self.blocks.keep_alive(owner)

    def unregister(self, owner: OwnerRef) -> int:
        """See :meth:`OwnerBlocks.unregister`."""
        return self.blocks.unregister(owner)

    def allocate(
        self,
        num_blocks: int,
        owner: OwnerRef = DEFAULT_OWNER,
        admitted_lookup: PrefixLookup | None = None,
    ) -> list[int]:
        """See :meth:`OwnerBlocks.allocate`.

        Args:
            admitted_lookup: set when these blocks admit a request for the first time: its prefix
                lookup (made with ``counted=False``) is counted once the blocks are taken.

        Raises:
            InvalidArgument: ``admitted_lookup`` has more hit than query tokens (nothing taken).
        """
        if admitted_lookup is not None and (
            admitted_lookup.num_hit_tokens > admitted_lookup.num_query_tokens
        ):
            raise InvalidArgument(
                "admitted_lookup",
                f"{admitted_lookup.num_hit_tokens} hit tokens of "
                f"{admitted_lookup.num_query_tokens} looked up",
            )
        block_ids = self.blocks.allocate(owner, num_blocks)
        if admitted_lookup is not None:
            self.cache.stats.count(admitted_lookup)
        return block_ids

    def free(self, block_ids: list[int], owner: OwnerRef = DEFAULT_OWNER) -> None:
        """See :meth:`OwnerBlocks.free`."""
        self.blocks.free(owner, block_ids)

    def lookup(
        self,
        token_ids: Sequence[int],
        cache_salt: str,
        owner: OwnerRef = DEFAULT_OWNER,
        counted: bool = True,
    ) -> list[int]:
        """See :meth:`OwnerBlocks.lookup`; ``counted=False``: the lookup is counted by the
        :meth:`allocate` that admits its request (``admitted_lookup``)."""
        return self.blocks.lookup(owner, token_ids, cache_salt, counted)

    def commit(self, entries: Sequence[CommitEntry], owner: OwnerRef = DEFAULT_OWNER) -> int:
        """See :meth:`OwnerBlocks.commit`."""
        return self.blocks.commit(owner, entries)

    def reconcile(
        self, held_block_ids: list[int], owner: OwnerRef = DEFAULT_OWNER
    ) -> ReconcileResult:
        """See :meth:`OwnerBlocks.reconcile`."""
        return self.blocks.reconcile(owner, held_block_ids)

    def sweep(self) -> None:
        """Expires lapsed leases and releases their owners' references; call every
        :attr:`sweep_interval_s`."""
        self.blocks.sweep()

    @property
    def sweep_interval_s(self) -> float:
        """How often :meth:`sweep` should run, seconds."""
        return self.blocks.sweep_interval_s

    def stats(self) -> KVStats:
        """Current counts, and every owner."""
        pool, s = self.cache.pool, self.cache.stats
        owners = self.blocks.owner_stats()
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
            num_owners=sum(not o.lease_expired for o in owners),
            owners=tuple(owners),
            recovering=self.blocks.recovering,
            num_blocks_evictable=self.cache.num_evictable_blocks,
        )

    def close(self, remove_arena: bool) -> None:
        """Removes the arena's file when ``remove_arena``; otherwise it stays for a restart."""
        if remove_arena or not self.arena.path:  # device memory cannot outlive us by name
            log.info("releasing the arena %s", self.arena.path or self.arena.device)
            self.arena.unlink()
        else:
            log.info("keeping the arena %s for a restart", self.arena.path)
