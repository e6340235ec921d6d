"""Conversion of the kvstore's owner messages (``zerolayer.v1.KVStore``: RegisterOwner,
KeepAlive, UnregisterOwner, the ``owner`` of block calls, Reconcile's answer, per-owner stats).

Durations are seconds (float) in the domain and whole milliseconds on the wire.
"""

from __future__ import annotations

from zerolayer.kv.owner import DEFAULT_OWNER, OwnerRef, OwnerStats, ReconcileResult, Registration
from zerolayer.v1 import kvstore_pb2


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def owner_to_pb(owner: OwnerRef | None) -> kvstore_pb2.OwnerRef | None:
    """The ``owner`` field of a block call; None (unset) for the default owner."""
    if owner is None or owner == DEFAULT_OWNER:
        return None
    return kvstore_pb2.OwnerRef(owner_id=owner.owner_id, epoch=owner.epoch)


def owner_from_pb(request: object) -> OwnerRef:
    """The owner of a request that has an ``owner`` field; unset: the default owner."""
    if not request.HasField("owner"):  # type: ignore[attr-defined]
        return DEFAULT_OWNER
    pb = request.owner  # type: ignore[attr-defined]
    return OwnerRef(pb.owner_id, pb.epoch)


def register_owner_request_to_pb(owner_id: str) -> kvstore_pb2.RegisterOwnerRequest:
    """A RegisterOwner request for ``owner_id``."""
    return kvstore_pb2.RegisterOwnerRequest(owner_id=owner_id)


def register_owner_request_from_pb(pb: kvstore_pb2.RegisterOwnerRequest) -> str:
    """The owner id a RegisterOwner request registers."""
    return pb.owner_id


def registration_to_pb(registration: Registration) -> kvstore_pb2.RegisterOwnerResponse:
    """The epoch and lease a registration got."""
    return kvstore_pb2.RegisterOwnerResponse(
        epoch=registration.epoch, lease_ms=_ms(registration.lease_s)
    )


def registration_from_pb(pb: kvstore_pb2.RegisterOwnerResponse) -> Registration:
    """The epoch and lease (seconds) of a RegisterOwner answer."""
    return Registration(pb.epoch, pb.lease_ms / 1000)


def keep_alive_request_to_pb(owner: OwnerRef) -> kvstore_pb2.KeepAliveRequest:
    """A KeepAlive of ``owner``."""
    return kvstore_pb2.KeepAliveRequest(owner=owner_to_pb(owner))


def keep_alive_response_to_pb(lease_s: float) -> kvstore_pb2.KeepAliveResponse:
    """The lease length after a keep-alive."""
    return kvstore_pb2.KeepAliveResponse(lease_ms=_ms(lease_s))


def keep_alive_response_from_pb(pb: kvstore_pb2.KeepAliveResponse) -> float:
    """The lease length (seconds) a KeepAlive answered."""
    return pb.lease_ms / 1000


def unregister_owner_request_to_pb(owner: OwnerRef) -> kvstore_pb2.UnregisterOwnerRequest:
    """An UnregisterOwner of ``owner``."""
    return kvstore_pb2.UnregisterOwnerRequest(owner=owner_to_pb(owner))


def unregister_owner_response_to_pb(num_blocks: int) -> kvstore_pb2.UnregisterOwnerResponse:
    """How many blocks the owner held when it unregistered."""
    return kvstore_pb2.UnregisterOwnerResponse(num_blocks_released=num_blocks)


def reconcile_result_to_pb(result: ReconcileResult) -> kvstore_pb2.ReconcileResponse:
    """A Reconcile answer."""
    return kvstore_pb2.ReconcileResponse(
        num_blocks_changed=result.num_blocks_changed,
        recovering=result.recovering,
        recovery_remaining_ms=_ms(result.recovery_remaining_s),
    )


def reconcile_result_from_pb(pb: kvstore_pb2.ReconcileResponse) -> ReconcileResult:
    """What a Reconcile answered (durations in seconds)."""
    return ReconcileResult(pb.num_blocks_changed, pb.recovering, pb.recovery_remaining_ms / 1000)


def get_stats_request_to_pb() -> kvstore_pb2.GetStatsRequest:
    """A GetStats request."""
    return kvstore_pb2.GetStatsRequest()


def kv_recovering_from_pb(pb: kvstore_pb2.KVStats) -> bool:
    """Whether the kvstore that answered GetStats recovers from a restart."""
    return pb.recovering


def owner_stats_to_pb(s: OwnerStats) -> kvstore_pb2.OwnerStats:
    """One owner of GetStats (lease fields unset for the default owner)."""
    return kvstore_pb2.OwnerStats(
        owner_id=s.owner_id,
        epoch=s.epoch,
        num_blocks_held=s.num_blocks_held,
        lease_remaining_ms=None if s.lease_remaining_s is None else _ms(s.lease_remaining_s),
        ms_since_keep_alive=None if s.s_since_keep_alive is None else _ms(s.s_since_keep_alive),
        lease_expired=s.lease_expired,
        reconciled=s.reconciled,
    )
