"""The kvstore's owners: the schedulers that share it, with their registrations, epochs, leases
and block references.

An owner registers under an id that stays the same across its restarts and gets an epoch one
higher than the id's last one; a call from an older epoch (a zombie predecessor) is refused and
changes nothing. A registered owner keeps a lease alive (keep-alives); :meth:`Owners.sweep`
expires the leases that lapsed, and the kvstore releases those owners' references. The default
owner ("", a scheduler that never registers) has no lease and never expires.

Every reference a block has belongs to one owner (:attr:`Owner.held`); the pool's ``ref_cnt`` of
a block is the sum of its owners' references (the kvstore keeps them in step,
:class:`zerolayer.kvstore.kv_store.KVStore`). The references an id holds carry over to its next
epoch until that epoch reconciles.

The latest epoch of every id, and whether its references were released, are reported to
``on_change`` (the kvstore records them beside its arena), so that a restarted kvstore still
refuses a zombie and still tells an expired owner that its lease expired.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.owner import DEFAULT_OWNER_ID, OwnerRef, OwnerStats, Registration
from zerolayer.kvstore.refusals import EpochStale, LeaseExpired, NotReconciled, NotRegistered

log = logging.getLogger(__name__)


def owner_name(owner_id: str) -> str:
    """How messages name an owner: ``owner 'a'``, or ``the default owner``."""
    return "the default owner" if owner_id == DEFAULT_OWNER_ID else f"owner {owner_id!r}"


@dataclass(frozen=True)
class OwnerRecord:
    """What outlives the kvstore process about an owner id."""

    epoch: int
    """The last epoch the id got."""
    released: bool = False
    """That epoch's lease expired or it unregistered (its references were released)."""


@dataclass
class Owner:
    """An owner as this kvstore process knows it."""

    owner_id: str
    epoch: int
    expires_at: float | None
    """Clock time its lease lapses, seconds; None: no lease (the default owner)."""
    last_keep_alive: float | None
    """Clock time of its last keep-alive or registration, seconds; None: the default owner."""
    lease_expired: bool = False
    """Its lease expired or it unregistered: its references were released."""
    reconciled: bool = False
    """It reconciled in this epoch."""
    held: Counter[int] = field(default_factory=Counter)
    """Block id -> references it holds (> 0)."""

    @property
    def ref(self) -> OwnerRef:
        """The id and epoch its calls carry."""
        return OwnerRef(self.owner_id, self.epoch)

    def check_holds(self, block_ids: Iterable[int], field_name: str) -> None:
        """Raises InvalidArgument (naming ``field_name``) for the first block it does not hold as
        often as ``block_ids`` lists it."""
        wanted = Counter(block_ids)
        for block_id, count in wanted.items():
            if count > self.held[block_id]:
                raise InvalidArgument(
                    field_name, f"block {block_id} is not held by {owner_name(self.owner_id)}"
                )

    def hold(self, block_ids: Iterable[int]) -> None:
        """Counts one more reference of it on each block."""
        self.held.update(block_ids)

    def drop(self, block_ids: Iterable[int]) -> None:
        """Counts one reference of it fewer on each block (blocks it then holds none of go)."""
        self.held.subtract(block_ids)
        self.held = +self.held

    def set_held(self, held_block_ids: Iterable[int]) -> tuple[list[int], list[int]]:
        """Makes its references exactly ``held_block_ids`` (a block listed n times: n).

        Returns:
            The references it gained and those it lost, each a block id once per reference, in
            id order (the pool takes and drops the same).
        """
        new = Counter(held_block_ids)
        gained: list[int] = []
        lost: list[int] = []
        for block_id in sorted(self.held.keys() | new.keys()):
            delta = new[block_id] - self.held[block_id]
            (gained if delta > 0 else lost).extend([block_id] * abs(delta))
        self.held = new
        return gained, lost


class Owners:
    """Registrations, epochs, leases and references. Not thread-safe (the kvstore's event loop
    drives it)."""

    def __init__(
        self,
        lease_s: float,
        clock: Callable[[], float] = time.monotonic,
        records: Mapping[str, OwnerRecord] | None = None,
        on_change: Callable[[dict[str, OwnerRecord]], None] | None = None,
    ) -> None:
        """
        Args:
            lease_s: lease length, seconds.
            clock: seconds, monotonic (tests inject one).
            records: what a previous process of this kvstore recorded (epochs go on from there).
            on_change: called with every record after each registration, expiry or release.

        Raises:
            ValueError: ``lease_s`` is not > 0.
        """
        if not lease_s > 0:
            raise ValueError("lease_s: must be > 0")
        self.lease_s = lease_s
        self.stall_s = lease_s / 3
        """A gap between two sweeps longer than this is a stall of the kvstore itself (e.g.
        SIGSTOP), during which no keep-alive could be received: leases are extended by it."""
        self.clock = clock
        self._records = dict(records or {})
        self._on_change = on_change
        self._owners: dict[str, Owner] = {}
        self._last_sweep: float | None = None

    @property
    def sweep_interval_s(self) -> float:
        """How often :meth:`sweep` should run, seconds (half the stall threshold)."""
        return self.stall_s / 2

    @property
    def owners(self) -> list[Owner]:
        """Every owner known since this process started, by id."""
        return [self._owners[owner_id] for owner_id in sorted(self._owners)]

    @property
    def live_owners(self) -> list[Owner]:
        """The owners whose lease has not expired (the default owner once seen)."""
        return [owner for owner in self.owners if not owner.lease_expired]

    def register(self, owner_id: str) -> Registration:
        """Registers ``owner_id`` at a new epoch (its last one + 1, or 1) with a fresh lease. The
        references its id holds stay until its first reconcile (a restarted scheduler declares
        none).

        Raises:
            InvalidArgument: ``owner_id`` is empty (the default owner never registers).
        """
        if owner_id == DEFAULT_OWNER_ID:
            raise InvalidArgument("owner_id", "empty; the default owner does not register")
        record = self._records.get(owner_id)
        previous = self._owners.get(owner_id)
        now = self.clock()
        owner = Owner(owner_id, (record.epoch if record else 0) + 1, now + self.lease_s, now)
        owner.held = previous.held if previous else owner.held
        self._owners[owner_id] = owner
        self._record(owner)
        log.info(
            "%s registered at epoch %d (lease %g s; %d block(s) held by the id until it "
            "reconciles)",
            owner_name(owner_id),
            owner.epoch,
            self.lease_s,
            len(owner.held),
        )
        return Registration(owner.epoch, self.lease_s)

    def check(self, ref: OwnerRef) -> Owner:
        """The caller's registration, if it may act (the default owner always may).

        Raises:
            EpochStale: another epoch of the id is current (or was, before a restart).
            LeaseExpired: the epoch's lease expired or it unregistered.
            NotRegistered: this kvstore process does not know the id (it restarted).
        """
        if ref.owner_id == DEFAULT_OWNER_ID:
            return self._owners.setdefault(DEFAULT_OWNER_ID, Owner(DEFAULT_OWNER_ID, 0, None, None))
        owner = self._owners.get(ref.owner_id)
        if owner is None:
            self._refuse_unknown(ref)
        if ref.epoch != owner.epoch:
            raise _stale(ref, owner.epoch)
        if owner.lease_expired:
            raise _expired(ref)
        return owner

    def acting(self, ref: OwnerRef) -> Owner:
        """The caller's registration, if it may make block calls: it may act
        (:meth:`check`) and it reconciled in its epoch.

        Raises:
            EpochStale, LeaseExpired, NotRegistered: see :meth:`check`.
            NotReconciled: it has not reconciled since it registered (since this kvstore
                started, for the default owner).
        """
        owner = self.check(ref)
        if not owner.reconciled:
            since = "this kvstore started" if ref.owner_id == DEFAULT_OWNER_ID else "it registered"
            raise NotReconciled(
                f"kvstore: {owner_name(ref.owner_id)} has not reconciled since {since}; call "
                "Reconcile with the blocks you hold first"
            )
        return owner

    def _refuse_unknown(self, ref: OwnerRef) -> NoReturn:
        """Refuses an owner this process has not registered, by what an earlier one recorded."""
        record = self._records.get(ref.owner_id)
        if record is not None and ref.epoch < record.epoch:
            raise _stale(ref, record.epoch)
        if record is not None and ref.epoch == record.epoch and record.released:
            raise _expired(ref)
        raise NotRegistered(
            f"{ref}: not registered with this kvstore (it restarted); register again and reconcile"
        )

    def keep_alive(self, ref: OwnerRef) -> float:
        """Renews the caller's lease for ``lease_s`` from now; returns ``lease_s``, seconds.

        Raises:
            EpochStale, LeaseExpired, NotRegistered: see :meth:`check`.
        """
        owner = self.check(ref)
        if owner.expires_at is not None:
            owner.last_keep_alive = self.clock()
            owner.expires_at = owner.last_keep_alive + self.lease_s
        return self.lease_s

    def release(self, owner: Owner) -> None:
        """Marks ``owner``'s references released (it unregistered, or its lease expired; the
        kvstore drops them from the pool): its later calls are refused as "lease expired"."""
        owner.lease_expired = True
        owner.expires_at = min(owner.expires_at or 0.0, self.clock())
        self._record(owner)

    def sweep(self) -> list[Owner]:
        """Expires the leases that lapsed; call about every ``stall_s / 2`` seconds.

        A gap since the previous sweep longer than ``stall_s`` means this process did not run
        (it was stopped, or its loop hung): every lease is extended by the gap first, since no
        keep-alive could arrive meanwhile.

        Returns:
            The owners whose lease expired now (the caller releases their references).
        """
        now = self.clock()
        gap = 0.0 if self._last_sweep is None else now - self._last_sweep
        self._last_sweep = now
        live = [o for o in self.live_owners if o.expires_at is not None]
        if gap > self.stall_s and live:
            log.warning("the kvstore did not run for %.1f s: leases extended by that", gap)
            for owner in live:
                owner.expires_at += gap  # type: ignore[operator]
        expired = [owner for owner in live if now >= owner.expires_at]  # type: ignore[operator]
        for owner in expired:
            self.release(owner)
        return expired

    def stats(self) -> list[OwnerStats]:
        """Every owner known since start, by id."""
        now = self.clock()
        return [
            OwnerStats(
                owner.owner_id,
                owner.epoch,
                len(owner.held),
                None if owner.expires_at is None else max(0.0, owner.expires_at - now),
                None if owner.last_keep_alive is None else now - owner.last_keep_alive,
                owner.lease_expired,
                owner.reconciled,
            )
            for owner in self.owners
        ]

    def _record(self, owner: Owner) -> None:
        self._records[owner.owner_id] = OwnerRecord(owner.epoch, owner.lease_expired)
        if self._on_change is not None:
            self._on_change(dict(self._records))


def _stale(ref: OwnerRef, current: int) -> EpochStale:
    return EpochStale(
        f"{ref}: refused: the current epoch of owner {ref.owner_id!r} is {current} (a newer "
        "registration replaced this one)"
    )


def _expired(ref: OwnerRef) -> LeaseExpired:
    return LeaseExpired(f"{ref}: lease expired; its block references were released, register again")
