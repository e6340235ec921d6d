"""Owners of KV block references: the schedulers that share one kvstore (``RegisterOwner``).

Each scheduler registers under an owner id that stays the same across its restarts; the kvstore
answers with an epoch, one higher at each registration of that id, and every block call carries
both (:class:`OwnerRef`), so a call from a zombie predecessor (an older epoch) is refused. The
owner keeps a lease alive; when it lapses the kvstore releases the owner's references.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_OWNER_ID = ""
"""The default owner: one scheduler that never registers (no lease, no epoch), as before owners
existed. A call without an owner is the default owner's."""

NOT_REGISTERED = "owner-not-registered"
"""Refusal reason: the kvstore does not know the owner at that epoch (it restarted): register
again and reconcile; the KV the owner holds is kept."""
LEASE_EXPIRED = "owner-lease-expired"
"""Refusal reason: the owner's lease expired (or it unregistered) and its references were
released: its KV is lost; register again, reconcile with nothing, recompute."""
EPOCH_STALE = "owner-epoch-stale"
"""Refusal reason: a newer registration of the same owner id exists: stop using the kvstore."""
NOT_RECONCILED = "owner-not-reconciled"
"""Refusal reason: the owner has not reconciled in its epoch yet."""
RECOVERING = "kvstore-recovering"
"""Refusal reason: the kvstore recovers from a restart and hands out no block yet.

(A refusal's reason travels as trailing metadata, see ``zerolayer.common.status.reason_of``.)"""


@dataclass(frozen=True)
class OwnerRef:
    """Who makes a block call: an owner id at an epoch."""

    owner_id: str = DEFAULT_OWNER_ID
    """The registered id; "" (the default) is the default owner."""
    epoch: int = 0
    """The epoch its registration returned (0 for the default owner)."""

    def __str__(self) -> str:
        return f"owner {self.owner_id!r} epoch {self.epoch}"


DEFAULT_OWNER = OwnerRef()
"""The default owner (see :data:`DEFAULT_OWNER_ID`)."""


@dataclass(frozen=True)
class Registration:
    """What ``RegisterOwner`` answers."""

    epoch: int
    """The owner's new epoch (>= 1)."""
    lease_s: float
    """Lease length, seconds: a keep-alive must arrive within it."""


@dataclass(frozen=True)
class ReconcileResult:
    """What ``Reconcile`` answers."""

    num_blocks_changed: int
    """Blocks whose reference count changed."""
    recovering: bool = False
    """The kvstore recovers from a restart: Allocate is refused until it ends; reconcile again."""
    recovery_remaining_s: float = 0.0
    """What is left of the recovery window, seconds (0 once it passed)."""


@dataclass(frozen=True)
class OwnerStats:
    """One owner as ``GetStats`` reports it."""

    owner_id: str
    epoch: int
    num_blocks_held: int
    """Blocks it holds at least one reference of."""
    lease_remaining_s: float | None
    """Seconds until its lease expires (0 once expired); None for the default owner."""
    s_since_keep_alive: float | None
    """Seconds since its last keep-alive or registration; None for the default owner."""
    lease_expired: bool
    """Its lease expired (or it unregistered): its references were released."""
    reconciled: bool
    """It reconciled in its current epoch."""
