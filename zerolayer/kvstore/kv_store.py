"""The kvstore's domain object: the arena, the prefix-caching block pool over it, and the owners
(schedulers) whose block calls it serves."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from zerolayer.common.config import KVStoreConfig
from zerolayer.common.device import fd_socket_path, resolve_device
from zerolayer.kv.arena_info import ArenaInfo
from zerolayer.kv.arena_layout import ArenaLayout, model_arena_layout
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import DEFAULT_OWNER, OwnerRef, ReconcileResult
from zerolayer.kv.pin import PinResult
from zerolayer.kv.stats import KVStats, PrefixHit, PrefixLookup
from zerolayer.kvstore.arena import Arena
from zerolayer.kvstore.owners import Owner, Owners, owner_name
from zerolayer.kvstore.pins import Pins
from zerolayer.kvstore.prefix_cache import HashFn, PrefixCache, xxh3_128
from zerolayer.kvstore.recovery import Recovery
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

    Each block call carries the caller's :class:`OwnerRef`; the store checks that the caller may
    act (:meth:`Owners.acting`), does the call on the pool (:class:`PrefixCache`) and counts the
    references it took or dropped as the caller's (:attr:`Owner.held`), so a block's ``ref_cnt``
    is always the sum of its owners' references. Registration and keep-alives are the owners'
    alone (:attr:`owners`); the restart rule is :class:`Recovery`'s. Not thread-safe: the
    kvstore's event loop drives it.

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
            layout.num_blocks,
            config.block_size,
            manifest.fingerprint,
            config.enable_prefix_caching,
            hash_fn,
        )
        self.clock = clock
        self.owners = Owners(
            config.owner_lease_s,
            clock,
            self.arena.owner_records(),
            on_change=self.arena.save_owner_records,
        )
        self.recovery = Recovery(self.arena.reopened, config.owner_lease_s, clock)
        self.pins = Pins(
            self.cache,
            layout.block_bytes,
            config.max_pinned_fraction,
            config.max_pinned_fraction_per_namespace,
            clock,
            testing_clock=config.testing_pin_clock,
        )
        if self.arena.reopened:
            # NOTE: pins live in memory, as the prefix index does: a restart forgets both, so no
            # pin can outlive the index that made its blocks findable (docs: "Pins").
            log.info("arena reopened: pins held before the restart, if any, are dropped")
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

    @property
    def recovering(self) -> bool:
        """Still recovering from a restart: no block is handed out."""
        return not self.recovery.is_over(self.owners.owners)

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

    def allocate(
        self,
        num_blocks: int,
        owner: OwnerRef = DEFAULT_OWNER,
        admitted_lookup: PrefixLookup | None = None,
    ) -> list[int]:
        """Takes free blocks for the caller (see :meth:`PrefixCache.allocate`).

        Raises:
            EpochStale, LeaseExpired, NotRegistered, NotReconciled: the caller may not act.
            Recovering: the kvstore recovers from a restart.
            InvalidArgument, ResourceExhausted: see :meth:`PrefixCache.allocate` (nothing taken).
        """
        holder = self.owners.acting(owner)
        self.recovery.check(self.owners.owners)
        self.pins.expire()  # a lapsed pin's blocks are evictable again
        block_ids = self.cache.allocate(num_blocks, admitted_lookup)
        holder.hold(block_ids)
        return block_ids

    def free(self, block_ids: list[int], owner: OwnerRef = DEFAULT_OWNER) -> None:
        """Drops one of the caller's references from each block, in the order given; a block
        left without references keeps its content until evicted. All ids are checked first.

        Raises:
            EpochStale, LeaseExpired, NotRegistered, NotReconciled: the caller may not act.
            InvalidArgument: an id is out of range, or names a block the caller does not hold
                (as often as it appears); nothing changes.
        """
        holder = self.owners.acting(owner)
        self.cache.check_ids(block_ids)
        holder.check_holds(block_ids, "block_ids")
        self.cache.free(block_ids)
        holder.drop(block_ids)
        self.pins.on_owner_release(block_ids)

    def lookup(
        self,
        token_ids: Sequence[int],
        cache_salt: str,
        owner: OwnerRef = DEFAULT_OWNER,
        counted: bool = True,
    ) -> PrefixHit:
        """The cached prefix's blocks, one reference each for the caller (see
        :meth:`PrefixCache.lookup`), and how many of them a live pin holds; hits may be blocks
        another owner committed or holds. ``counted=False``: the lookup is counted by the
        :meth:`allocate` that admits its request (``admitted_lookup``).

        Raises:
            EpochStale, LeaseExpired, NotRegistered, NotReconciled: the caller may not act.
        """
        holder = self.owners.acting(owner)
        self.pins.expire()  # a lapsed pin's blocks are no pinned hit
        block_ids = self.cache.lookup(token_ids, cache_salt, counted)
        holder.hold(block_ids)
        self.pins.on_hit(cache_salt, block_ids)
        return PrefixHit(block_ids, self.pins.blocks.num_pinned(block_ids))

    def commit(self, entries: Sequence[CommitEntry], owner: OwnerRef = DEFAULT_OWNER) -> int:
        """Registers full blocks the caller holds (see :meth:`PrefixCache.commit`); returns how
        many were newly registered.

        Raises:
            EpochStale, LeaseExpired, NotRegistered, NotReconciled: the caller may not act.
            InvalidArgument: a block the caller does not hold (nothing is registered), or a wrong
                token count.
        """
        holder = self.owners.acting(owner)
        # NOTE: committing takes no reference: one held reference covers a block listed twice.
        holder.check_holds(list(dict.fromkeys(e.block_id for e in entries)), "block_id")
        return self.cache.commit(entries)

    def reconcile(
        self, held_block_ids: list[int], owner: OwnerRef = DEFAULT_OWNER
    ) -> ReconcileResult:
        """Rebuilds the caller's references to exactly ``held_block_ids`` (a block listed n times
        gets n; other owners' are untouched) and lets it act; says whether the kvstore still
        recovers from a restart. A block that gains its first reference leaves the free queue
        (content kept); blocks that lose their last one join its back in id order.

        Raises:
            EpochStale, LeaseExpired, NotRegistered: the caller may not act.
            InvalidArgument: an id is out of range (nothing is changed).
        """
        holder = self.owners.check(owner)
        self.cache.check_ids(held_block_ids, "held_block_ids")
        changed = self._set_references(holder, held_block_ids)
        if changed or not holder.reconciled:
            # NOTE: a correction means a restart lost track of blocks: worth a warning. A first
            # reconcile that changes nothing is the normal start.
            log.log(
                logging.WARNING if changed else logging.INFO,
                "reconcile: %d block(s) held by %s (epoch %d), %d reference count(s) corrected",
                len(set(held_block_ids)),
                owner_name(holder.owner_id),
                holder.epoch,
                changed,
            )
        holder.reconciled = True
        return ReconcileResult(changed, self.recovering, self.recovery.remaining_s())

    def unregister(self, owner: OwnerRef) -> int:
        """Releases every reference of the caller and ends its lease; returns how many blocks it
        held.

        Raises:
            EpochStale, LeaseExpired, NotRegistered: see :meth:`Owners.check`.
        """
        holder = self.owners.check(owner)
        num_blocks = self._set_references(holder, [])
        self.owners.release(holder)
        log.info("%s unregistered; released %d block(s)", owner, num_blocks)
        return num_blocks

    def sweep(self) -> None:
        """Expires lapsed leases (see :meth:`Owners.sweep`) and releases those owners'
        references; their blocks stay cached; releases lapsed pins. Call every
        ``owners.sweep_interval_s``."""
        self.pins.expire()
        for holder in self.owners.sweep():
            num_blocks = self._set_references(holder, [])
            log.warning(
                "%s: lease expired (no keep-alive for %.1f s); released its %d block(s)",
                holder.ref,
                self.clock() - (holder.last_keep_alive or 0.0),
                num_blocks,
            )

    def _set_references(self, holder: Owner, held_block_ids: list[int]) -> int:
        """Makes ``holder``'s references (ids checked) exactly ``held_block_ids``, in the pool
        too; returns how many blocks' counts changed."""
        gained, lost = holder.set_held(held_block_ids)
        self.cache.incref(gained)
        self.cache.free(lost)
        self.pins.on_owner_release(lost)
        return len(set(gained)) + len(set(lost))

    def pin(
        self,
        token_ids: Sequence[int],
        cache_salt: str,
        ttl_s: float,
        renew_on_hit: bool,
        key: str = "",
        budget_namespace: str = "",
    ) -> PinResult:
        """Pins the longest committed prefix of ``token_ids``' full blocks under
        ``cache_salt`` (the same blocks a lookup of ``token_ids`` plus one token would hit) for
        ``ttl_s`` seconds, held by the kvstore itself; or renews the identical pin of ``key``,
        replaces the earlier pin of a non-empty ``key``, or refuses, pinning nothing (see
        :meth:`Pins.pin`). Any caller may pin: pins belong to no owner.

        Raises:
            Recovering: the kvstore recovers from a restart (which blocks are free is unknown).
            InvalidArgument: ``ttl_s`` is not a finite number > 0, or ``key`` is too long.
        """
        self.recovery.check(self.owners.owners)
        return self.pins.pin(token_ids, cache_salt, ttl_s, renew_on_hit, key, budget_namespace)

    def stats(self) -> KVStats:
        """Current counts, every owner, and the pins (lapsed ones released first)."""
        self.pins.expire()
        cache, counters = self.cache, self.cache.stats
        owners = self.owners.stats()
        return KVStats(
            cache.num_blocks,
            cache.num_free_blocks,
            cache.num_used_blocks,
            cache.num_cached_blocks,
            cache.enabled,
            counters.num_queries,
            counters.num_query_tokens,
            counters.num_hit_tokens,
            counters.hit_ratio,
            counters.num_evictions,
            num_owners=sum(not o.lease_expired for o in owners),
            owners=tuple(owners),
            recovering=self.recovering,
            num_blocks_evictable=cache.num_evictable_blocks,
            pins=self.pins.stats(),
        )

    def close(self, remove_arena: bool) -> None:
        """Removes the arena's file when ``remove_arena``; otherwise it stays for a restart."""
        if remove_arena or not self.arena.path:  # device memory cannot outlive us by name
            log.info("releasing the arena %s", self.arena.path or self.arena.device)
            self.arena.unlink()
        else:
            log.info("keeping the arena %s for a restart", self.arena.path)
