"""Conversions of the kvstore's pin calls (Pin, RenewPin, ReleasePin, ReleaseNamespacePins,
AdvancePinClock) and of GetStats' pins."""

from __future__ import annotations

from collections.abc import Sequence

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.pin import PinResult, PinsReleased, PinStats
from zerolayer.v1 import kvstore_pb2


def pin_request_to_pb(
    token_ids: Sequence[int],
    cache_salt: str,
    ttl_s: float,
    renew_on_hit: bool,
    key: str = "",
    budget_namespace: str = "",
) -> kvstore_pb2.PinRequest:
    """A Pin request; ``ttl_s`` is rounded to whole ms."""
    return kvstore_pb2.PinRequest(
        token_ids=token_ids,
        cache_salt=cache_salt,
        ttl_ms=round(ttl_s * 1000),
        renew_on_hit=renew_on_hit,
        key=key,
        budget_namespace=budget_namespace,
    )


def pin_request_from_pb(
    pb: kvstore_pb2.PinRequest,
) -> tuple[list[int], str, float, bool, str, str]:
    """(token ids, cache salt, ttl in seconds, renew on hit, key, budget namespace) of a Pin
    request.

    Raises:
        InvalidArgument: ``ttl_ms`` is 0.
    """
    if not pb.ttl_ms:
        raise InvalidArgument("ttl_ms", "must be > 0")
    return (
        list(pb.token_ids),
        pb.cache_salt,
        pb.ttl_ms / 1000,
        pb.renew_on_hit,
        pb.key,
        pb.budget_namespace,
    )


def pin_result_to_pb(result: PinResult, block_size: int) -> kvstore_pb2.PinResponse:
    """A Pin answer: the pin, or the refusal (``num_tokens`` = blocks x ``block_size``)."""
    return kvstore_pb2.PinResponse(
        pin_id=result.pin_id,
        num_blocks=result.num_blocks,
        num_tokens=result.num_blocks * block_size,
        refusal=result.refusal,
        message=result.message,
    )


def pin_result_from_pb(pb: kvstore_pb2.PinResponse, ttl_s: float) -> PinResult:
    """The pin or refusal a Pin answer carries (``ttl_s``: the one asked for)."""
    expires_in_s = ttl_s if pb.pin_id else 0.0
    return PinResult(pb.pin_id, pb.num_blocks, expires_in_s, pb.refusal, pb.message)


def renew_pin_request_from_pb(pb: kvstore_pb2.RenewPinRequest) -> tuple[str, float | None]:
    """(pin id, new ttl in seconds or None for the pin's own) of a RenewPin request."""
    return pb.pin_id, pb.ttl_ms / 1000 if pb.ttl_ms else None


def renew_pin_response_to_pb(expires_in_s: float | None) -> kvstore_pb2.RenewPinResponse:
    """A RenewPin answer: found, and the ms left, or not found (None)."""
    if expires_in_s is None:
        return kvstore_pb2.RenewPinResponse(found=False)
    return kvstore_pb2.RenewPinResponse(found=True, expires_in_ms=round(expires_in_s * 1000))


def release_pin_request_to_pb(pin_id: str) -> kvstore_pb2.ReleasePinRequest:
    """A ReleasePin request of the pin ``pin_id``."""
    return kvstore_pb2.ReleasePinRequest(pin_id=pin_id)


def pin_namespaces_from_pb(pb: kvstore_pb2.KVStats) -> tuple[str, ...]:
    """The budget namespaces a GetStats answer lists pins in."""
    return tuple(n.cache_salt for n in pb.pins.namespaces)


def release_pin_response_to_pb(num_blocks: int | None) -> kvstore_pb2.ReleasePinResponse:
    """A ReleasePin answer: found, and the blocks the pin held, or not found (None)."""
    if num_blocks is None:
        return kvstore_pb2.ReleasePinResponse(found=False)
    return kvstore_pb2.ReleasePinResponse(found=True, num_blocks=num_blocks)


def release_namespace_pins_request_to_pb(
    cache_salt_prefix: str,
) -> kvstore_pb2.ReleaseNamespacePinsRequest:
    """A ReleaseNamespacePins request: the pins of every namespace whose cache salt starts with
    ``cache_salt_prefix`` ("": all)."""
    return kvstore_pb2.ReleaseNamespacePinsRequest(cache_salt_prefix=cache_salt_prefix)


def release_namespace_pins_request_from_pb(pb: kvstore_pb2.ReleaseNamespacePinsRequest) -> str:
    """The cache salt prefix of the namespaces whose pins a ReleaseNamespacePins request ends."""
    return pb.cache_salt_prefix


def release_namespace_pins_response_to_pb(
    released: PinsReleased,
) -> kvstore_pb2.ReleaseNamespacePinsResponse:
    """A ReleaseNamespacePins answer: the pins ended and the distinct blocks they held."""
    return kvstore_pb2.ReleaseNamespacePinsResponse(
        num_pins=released.num_pins, num_blocks=released.num_blocks
    )


def release_namespace_pins_response_from_pb(
    pb: kvstore_pb2.ReleaseNamespacePinsResponse,
) -> PinsReleased:
    """What a ReleaseNamespacePins call ended."""
    return PinsReleased(pb.num_pins, pb.num_blocks)


def advance_pin_clock_request_to_pb(advance_s: float) -> kvstore_pb2.AdvancePinClockRequest:
    """An AdvancePinClock request (tests only); ``advance_s`` is rounded to whole ms.

    Raises:
        InvalidArgument: ``advance_s`` is negative.
    """
    if advance_s < 0:
        raise InvalidArgument("advance_s", f"{advance_s} is negative: the clock only moves forward")
    return kvstore_pb2.AdvancePinClockRequest(advance_ms=round(advance_s * 1000))


def advance_pin_clock_request_from_pb(pb: kvstore_pb2.AdvancePinClockRequest) -> float:
    """How far an AdvancePinClock request moves the pins' clock, seconds."""
    return pb.advance_ms / 1000


def advance_pin_clock_response_to_pb(num_expired: int) -> kvstore_pb2.AdvancePinClockResponse:
    """An AdvancePinClock answer: how many pins expired because of it."""
    return kvstore_pb2.AdvancePinClockResponse(num_expired=num_expired)


def advance_pin_clock_response_from_pb(pb: kvstore_pb2.AdvancePinClockResponse) -> int:
    """How many pins an AdvancePinClock call expired."""
    return pb.num_expired


def pin_stats_to_pb(s: PinStats) -> kvstore_pb2.PinStats:
    """GetStats' pins; bytes are blocks x the arena's block bytes."""
    return kvstore_pb2.PinStats(
        max_pinned_blocks=s.max_pinned_blocks,
        max_pinned_blocks_per_namespace=s.max_pinned_blocks_per_namespace,
        namespaces=[
            kvstore_pb2.NamespacePinStats(
                cache_salt=n.cache_salt,
                num_pins=n.num_pins,
                num_blocks_pinned=n.num_blocks_pinned,
                num_bytes_pinned=n.num_blocks_pinned * s.block_bytes,
            )
            for n in s.namespaces
        ],
        num_pin_hits=s.num_pin_hits,
        num_pin_misses=s.num_pin_misses,
        num_pin_refusals=s.num_pin_refusals,
        num_evictions_avoided=s.num_evictions_avoided,
        num_pins_replaced=s.num_pins_replaced,
        num_pins_released_by_namespace=s.num_pins_released_by_namespace,
    )
