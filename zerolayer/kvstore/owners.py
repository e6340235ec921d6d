"""The kvstore's owners: registrations, epochs and leases of the schedulers that share it.

An owner registers under an id that stays the same across its restarts and gets an epoch one
higher than the id's last one; a call from an older epoch (a zombie predecessor) is refused and
changes nothing. A registered owner keeps a lease alive (keep-alives); :meth:`OwnerTable.sweep`
expires the leases that lapsed, and the caller releases those owners' references. The default
owner ("", a scheduler that never registers) has no lease and never expires.

The latest epoch of every id, and whether its references were released, are reported to
``on_change`` (the kvstore records them beside its arena), so that a restarted kvstore still
refuses a zombie and still tells an expired owner that its lease expired.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from zerolayer.common.errors import FailedPrecondition, InvalidArgument
from zerolayer.kv.owner import (
    DEFAULT_OWNER_ID,
    EPOCH_STALE,
    LEASE_EXPIRED,
    NOT_RECONCILED,
    NOT_REGISTERED,
    OwnerRef,
)

log = logging.getLogger(__name__)


class OwnerRefused(FailedPrecondition):
    """A call of an owner that may not act (FAILED_PRECONDITION); ``reason`` says why."""


class NotRegistered(OwnerRefused):
    """The kvstore does not know the owner at that epoch (it restarted): register again."""

    reason = NOT_REGISTERED


class LeaseExpired(OwnerRefused):
    """The owner's lease expired (or it unregistered): its references were released."""

    reason = LEASE_EXPIRED


class EpochStale(OwnerRefused):
    """A newer registration of the owner id exists: the caller is a zombie predecessor."""

    reason = EPOCH_STALE


class NotReconciled(OwnerRefused):
    """The owner has not reconciled in its epoch (since this kvstore's start, for the default
    owner)."""

    reason = NOT_RECONCILED


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

    @property
    def ref(self) -> OwnerRef:
        """The id and epoch its calls carry."""
        return OwnerRef(self.owner_id, self.epoch)


class OwnerTable:
    """Registrations, epochs and leases. Not thread-safe (the kvstore's event loop drives it)."""

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
    def owners(self) -> list[Owner]:
        """Every owner known since this process started, by id."""
        return [self._owners[owner_id] for owner_id in sorted(self._owners)]

    @property
    def live_owners(self) -> list[Owner]:
        """The owners whose lease has not expired (the default owner once seen)."""
        return [owner for owner in self.owners if not owner.lease_expired]

    def register(self, owner_id: str) -> Owner:
        """Registers ``owner_id`` at a new epoch (its last one + 1, or 1) with a fresh lease.

        Raises:
            InvalidArgument: ``owner_id`` is empty (the default owner never registers).
        """
        if owner_id == DEFAULT_OWNER_ID:
            raise InvalidArgument("owner_id", "empty; the default owner does not register")
        previous = self._records.get(owner_id)
        now = self.clock()
        owner = Owner(owner_id, (previous.epoch if previous else 0) + 1, now + self.lease_s, now)
        self._owners[owner_id] = owner
        self._record(owner)
        return owner

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

    def keep_alive(self, ref: OwnerRef) -> Owner:
        """Renews the caller's lease for ``lease_s`` from now.

        Raises:
            EpochStale, LeaseExpired, NotRegistered: see :meth:`check`.
        """
        owner = self.check(ref)
        if owner.expires_at is not None:
            owner.last_keep_alive = self.clock()
            owner.expires_at = owner.last_keep_alive + self.lease_s
        return owner

    def release(self, owner: Owner) -> None:
        """Marks ``owner``'s references released (it unregistered, or its lease expired): its
        later calls are refused as "lease expired"."""
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
