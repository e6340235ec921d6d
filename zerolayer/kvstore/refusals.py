"""The kvstore's refusals of a block call: FAILED_PRECONDITION, each with its machine-readable
reason (``zerolayer.kv.owner``; sent as trailing metadata, see
``zerolayer.common.status.reason_of``)."""

from __future__ import annotations

from zerolayer.common.errors import FailedPrecondition
from zerolayer.kv.owner import (
    EPOCH_STALE,
    LEASE_EXPIRED,
    NOT_RECONCILED,
    NOT_REGISTERED,
    RECOVERING,
)


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


class Recovering(FailedPrecondition):
    """The kvstore recovers from a restart and hands out no block yet."""

    reason = RECOVERING
