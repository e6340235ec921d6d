"""The kvstore's blocks as its owners see them: every block call checked against the caller's
registration, counted per owner, and allocation held back while a restarted kvstore recovers.

The pieces: :class:`zerolayer.kvstore.owners.OwnerTable` (registrations, epochs, leases),
:class:`zerolayer.kvstore.owner_refs.OwnerRefs` (references per owner over the prefix cache),
:class:`zerolayer.kvstore.recovery.Recovery` (the restart rule).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import DEFAULT_OWNER_ID, OwnerRef, OwnerStats, ReconcileResult, Registration
from zerolayer.kvstore.owner_refs import OwnerRefs, owner_name
from zerolayer.kvstore.owners import NotReconciled, Owner, OwnerRecord, OwnerTable
from zerolayer.kvstore.prefix_cache import PrefixCache
from zerolayer.kvstore.recovery import Recovery

log = logging.getLogger(__name__)


class OwnerRecordStore(Protocol):
    """Where the owners' records outlive the process (the arena's sidecar), and whether the
    arena was reopened (a restart: recovery needed)."""

    reopened: bool

    def owner_records(self) -> dict[str, OwnerRecord]:
        """What an earlier kvstore process recorded."""

    def save_owner_records(self, records: dict[str, OwnerRecord]) -> None:
        """Records ``records`` for a later kvstore process."""


class OwnerBlocks:
    """Block operations on behalf of owners. Not thread-safe (the event loop drives it)."""

    def __init__(
        self,
        cache: PrefixCache,
        records: OwnerRecordStore,
        lease_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            cache: the prefix-caching block pool.
            records: the arena (its owner records; ``reopened`` starts a recovery).
            lease_s: lease length, seconds; also the recovery window.
            clock: seconds, monotonic (tests inject one).

        Raises:
            ValueError: ``lease_s`` is not > 0.
        """
        self.clock = clock
        self.refs = OwnerRefs(cache)
        self.owners = OwnerTable(
            lease_s, clock, records.owner_records(), on_change=records.save_owner_records
        )
        self.recovery = Recovery(records.reopened, lease_s, clock)

    @property
    def sweep_interval_s(self) -> float:
        """How often :meth:`sweep` should run, seconds (half the stall threshold)."""
        return self.owners.stall_s / 2

    @property
    def recovering(self) -> bool:
        """Still recovering from a restart: no block is handed out."""
        return not self.recovery.is_over(self.owners.owners)

    def register(self, owner_id: str) -> Registration:
        """Registers ``owner_id`` at a new epoch (see :meth:`OwnerTable.register`). The references
        its id holds stay until its first reconcile (a restarted scheduler declares none).

        Raises:
            InvalidArgument: ``owner_id`` is empty.
        """
        owner = self.owners.register(owner_id)
        log.info(
            "%s registered at epoch %d (lease %g s; %d block(s) held by the id until it "
            "reconciles)",
            owner_name(owner_id),
            owner.epoch,
            self.owners.lease_s,
            self.refs.num_blocks_held(owner_id),
        )
        return Registration(owner.epoch, self.owners.lease_s)

    def keep_alive(self, ref: OwnerRef) -> float:
        """Renews the caller's lease; returns its length, seconds.

        Raises:
            EpochStale, LeaseExpired, NotRegistered: see :meth:`OwnerTable.check`.
        """
        self.owners.keep_alive(ref)
        return self.owners.lease_s

    def unregister(self, ref: OwnerRef) -> int:
        """Releases every reference of the caller and ends its lease; returns how many blocks it
        held.

        Raises:
            EpochStale, LeaseExpired, NotRegistered: see :meth:`OwnerTable.check`.
        """
        owner = self.owners.check(ref)
        num_blocks = self.refs.release(owner.owner_id)
        self.owners.release(owner)
        log.info("%s unregistered; released %d block(s)", ref, num_blocks)
        return num_blocks

    def sweep(self) -> None:
        """Expires lapsed leases (see :meth:`OwnerTable.sweep`) and releases those owners'
        references; their blocks stay cached."""
        for owner in self.owners.sweep():
            num_blocks = self.refs.release(owner.owner_id)
            log.warning(
                "%s: lease expired (no keep-alive for %.1f s); released its %d block(s)",
                owner.ref,
                self.clock() - (owner.last_keep_alive or 0.0),
                num_blocks,
            )

    def _acting(self, ref: OwnerRef) -> Owner:
        owner = self.owners.check(ref)
        if not owner.reconciled:
            since = "this kvstore started" if ref.owner_id == DEFAULT_OWNER_ID else "it registered"
            raise NotReconciled(
                f"kvstore: {owner_name(ref.owner_id)} has not reconciled since {since}; call "
                "Reconcile with the blocks you hold first"
            )
        return owner

    def allocate(self, ref: OwnerRef, num_blocks: int) -> list[int]:
        """Takes free blocks for the caller (see :meth:`OwnerRefs.allocate`).

        Raises:
            EpochStale, LeaseExpired, NotRegistered, NotReconciled: the caller may not act.
            Recovering: the kvstore recovers from a restart.
            InvalidArgument, ResourceExhausted: see :meth:`OwnerRefs.allocate`.
        """
        owner = self._acting(ref)
        self.recovery.check(self.owners.owners)
        return self.refs.allocate(owner.owner_id, num_blocks)

    def free(self, ref: OwnerRef, block_ids: list[int]) -> None:
        """Drops one of the caller's references from each block (see :meth:`OwnerRefs.free`).

        Raises:
            EpochStale, LeaseExpired, NotRegistered, NotReconciled: the caller may not act.
            InvalidArgument: a block the caller does not hold; nothing changes.
        """
        self.refs.free(self._acting(ref).owner_id, block_ids)

    def lookup(
        self, ref: OwnerRef, token_ids: Sequence[int], cache_salt: str, counted: bool = True
    ) -> list[int]:
        """The cached prefix's blocks, referenced for the caller (see :meth:`OwnerRefs.lookup`).

        Raises:
            EpochStale, LeaseExpired, NotRegistered, NotReconciled: the caller may not act.
        """
        return self.refs.lookup(self._acting(ref).owner_id, token_ids, cache_salt, counted)

    def commit(self, ref: OwnerRef, entries: Sequence[CommitEntry]) -> int:
        """Registers full blocks the caller holds (see :meth:`OwnerRefs.commit`).

        Raises:
            EpochStale, LeaseExpired, NotRegistered, NotReconciled: the caller may not act.
            InvalidArgument: a block the caller does not hold, or a wrong token count.
        """
        return self.refs.commit(self._acting(ref).owner_id, entries)

    def reconcile(self, ref: OwnerRef, held_block_ids: list[int]) -> ReconcileResult:
        """Rebuilds the caller's references from its declaration (other owners' are untouched)
        and lets it act; says whether the kvstore still recovers from a restart.

        Raises:
            EpochStale, LeaseExpired, NotRegistered: the caller may not act.
            InvalidArgument: an id is out of range (nothing is changed).
        """
        owner = self.owners.check(ref)
        changed = self.refs.reconcile(owner.owner_id, held_block_ids)
        if changed or not owner.reconciled:
            # NOTE: a correction means a restart lost track of blocks: worth a warning. A first
            # reconcile that changes nothing is the normal start.
            log.log(
                logging.WARNING if changed else logging.INFO,
                "reconcile: %d block(s) held by %s (epoch %d), %d reference count(s) corrected",
                len(set(held_block_ids)),
                owner_name(owner.owner_id),
                owner.epoch,
                changed,
            )
        owner.reconciled = True
        recovering = self.recovering
        return ReconcileResult(changed, recovering, self.recovery.remaining_s())

    def owner_stats(self) -> list[OwnerStats]:
        """Every owner known since start, by id."""
        now = self.clock()
        return [
            OwnerStats(
                owner.owner_id,
                owner.epoch,
                self.refs.num_blocks_held(owner.owner_id),
                None if owner.expires_at is None else max(0.0, owner.expires_at - now),
                None if owner.last_keep_alive is None else now - owner.last_keep_alive,
                owner.lease_expired,
                owner.reconciled,
            )
            for owner in self.owners.owners
        ]
