"""Conversion of the kvstore's messages (``zerolayer.v1.KVStore``).

Block ids and token ids are ``uint32`` on the wire and ``list[int]`` in the domain.
"""

from __future__ import annotations

from collections.abc import Sequence

from zerolayer.common.convert.kvstore_owners import owner_stats_to_pb, owner_to_pb
from zerolayer.common.convert.kvstore_pins import pin_stats_to_pb
from zerolayer.common.convert.loader import device_memory_from_pb, device_memory_to_pb
from zerolayer.kv.arena_info import ArenaInfo
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import OwnerRef
from zerolayer.kv.stats import KVStats, PrefixHit, PrefixLookup
from zerolayer.sharing.manifest import HandleKind
from zerolayer.v1 import kvstore_pb2

_KNOWN_KINDS = frozenset(int(k) for k in HandleKind)


def arena_request_to_pb(accepted: Sequence[HandleKind]) -> kvstore_pb2.GetArenaRequest:
    """A GetArena request from an importer that maps the ``accepted`` kinds (best first)."""
    return kvstore_pb2.GetArenaRequest(accepted_handle_kinds=[int(k) for k in accepted])


def arena_request_from_pb(pb: kvstore_pb2.GetArenaRequest) -> list[HandleKind]:
    """The accepted handle kinds of a GetArena request; kinds this build does not know are
    dropped (a newer importer may name more)."""
    return [HandleKind(k) for k in pb.accepted_handle_kinds if k in _KNOWN_KINDS]


def arena_info_to_pb(a: ArenaInfo) -> kvstore_pb2.ArenaInfo:
    """Domain arena info to its wire form (sizes derived from the layout)."""
    layout = a.layout
    return kvstore_pb2.ArenaInfo(
        device=a.device,
        handle_kind=int(a.handle_kind),
        device_memory=(
            device_memory_to_pb(a.device_memory) if a.device_memory is not None else None
        ),
        shm_path=a.shm_path,
        size_bytes=layout.size_bytes,
        num_blocks=layout.num_blocks,
        block_size=layout.block_size,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=layout.dtype,
        block_bytes=layout.block_bytes,
        arena_id=a.arena_id,
    )


def arena_info_from_pb(pb: kvstore_pb2.ArenaInfo) -> ArenaInfo:
    """Wire arena info to the domain form."""
    return ArenaInfo(
        arena_id=pb.arena_id,
        layout=ArenaLayout(
            num_layers=pb.num_layers,
            num_kv_heads=pb.num_kv_heads,
            head_dim=pb.head_dim,
            block_size=pb.block_size,
            dtype=pb.dtype,
            num_blocks=pb.num_blocks,
        ),
        handle_kind=HandleKind(pb.handle_kind),
        device=pb.device,
        shm_path=pb.shm_path,
        device_memory=(
            device_memory_from_pb(pb.device_memory) if pb.HasField("device_memory") else None
        ),
    )


def allocate_request_to_pb(
    num_blocks: int, owner: OwnerRef | None = None, admitted_lookup: PrefixLookup | None = None
) -> kvstore_pb2.AllocateRequest:
    """An Allocate request for ``num_blocks`` blocks for ``owner`` (None: the default owner),
    counting ``admitted_lookup`` (the prefix lookup of the request it admits) if given."""
    pb = kvstore_pb2.AllocateRequest(num_blocks=num_blocks, owner=owner_to_pb(owner))
    if admitted_lookup is not None:
        pb.admitted_lookup.num_query_tokens = admitted_lookup.num_query_tokens
        pb.admitted_lookup.num_hit_tokens = admitted_lookup.num_hit_tokens
    return pb


def allocate_request_from_pb(pb: kvstore_pb2.AllocateRequest) -> tuple[int, PrefixLookup | None]:
    """(the number of blocks an Allocate request asks for, the admitted lookup to count or
    None)."""
    admitted = None
    if pb.HasField("admitted_lookup"):
        lookup = pb.admitted_lookup
        admitted = PrefixLookup(lookup.num_query_tokens, lookup.num_hit_tokens)
    return pb.num_blocks, admitted


def allocate_response_to_pb(block_ids: Sequence[int]) -> kvstore_pb2.AllocateResponse:
    """The blocks allocated."""
    return kvstore_pb2.AllocateResponse(block_ids=block_ids)


def allocate_response_from_pb(pb: kvstore_pb2.AllocateResponse) -> list[int]:
    """The block ids of an Allocate answer."""
    return list(pb.block_ids)


def free_request_to_pb(
    block_ids: Sequence[int], owner: OwnerRef | None = None
) -> kvstore_pb2.FreeRequest:
    """A Free request dropping one of ``owner``'s references from each block."""
    return kvstore_pb2.FreeRequest(block_ids=block_ids, owner=owner_to_pb(owner))


def free_request_from_pb(pb: kvstore_pb2.FreeRequest) -> list[int]:
    """The block ids of a Free request."""
    return list(pb.block_ids)


def free_response_to_pb() -> kvstore_pb2.FreeResponse:
    """A Free answer (it has no fields)."""
    return kvstore_pb2.FreeResponse()


def lookup_prefix_request_to_pb(
    token_ids: Sequence[int],
    cache_salt: str,
    owner: OwnerRef | None = None,
    count_with_allocate: bool = False,
) -> kvstore_pb2.LookupPrefixRequest:
    """A LookupPrefix request for a prompt's token ids in the ``cache_salt`` namespace, the hits
    referenced for ``owner``; ``count_with_allocate``: counted by the Allocate that admits the
    request, not now."""
    return kvstore_pb2.LookupPrefixRequest(
        token_ids=token_ids,
        cache_salt=cache_salt,
        owner=owner_to_pb(owner),
        count_with_allocate=count_with_allocate,
    )


def lookup_prefix_request_from_pb(
    pb: kvstore_pb2.LookupPrefixRequest,
) -> tuple[list[int], str, bool]:
    """(token ids, cache salt, count it now) of a LookupPrefix request."""
    return list(pb.token_ids), pb.cache_salt, not pb.count_with_allocate


def lookup_prefix_response_to_pb(
    hit: PrefixHit, block_size: int
) -> kvstore_pb2.LookupPrefixResponse:
    """The blocks of the cached prefix and how many a pin holds; ``num_cached_tokens`` is their
    tokens (``block_size`` each: only full blocks are cached)."""
    return kvstore_pb2.LookupPrefixResponse(
        block_ids=hit.block_ids,
        num_cached_tokens=len(hit.block_ids) * block_size,
        num_pinned_blocks=hit.num_pinned_blocks,
    )


def lookup_prefix_response_from_pb(pb: kvstore_pb2.LookupPrefixResponse) -> PrefixHit:
    """The blocks of the cached prefix and how many of them a pin holds."""
    return PrefixHit(list(pb.block_ids), pb.num_pinned_blocks)


def commit_blocks_request_to_pb(
    entries: Sequence[CommitEntry], owner: OwnerRef | None = None
) -> kvstore_pb2.CommitBlocksRequest:
    """A CommitBlocks request registering full blocks ``owner`` holds."""
    blocks = [
        kvstore_pb2.CommitBlock(
            block_id=e.block_id,
            parent_block_id=e.parent_block_id,
            token_ids=e.token_ids,
            cache_salt=e.cache_salt,
        )
        for e in entries
    ]
    return kvstore_pb2.CommitBlocksRequest(blocks=blocks, owner=owner_to_pb(owner))


def commit_blocks_request_from_pb(pb: kvstore_pb2.CommitBlocksRequest) -> list[CommitEntry]:
    """The entries of a CommitBlocks request (an unset parent is None: the first block)."""
    return [
        CommitEntry(
            b.block_id,
            b.parent_block_id if b.HasField("parent_block_id") else None,
            tuple(b.token_ids),
            b.cache_salt,
        )
        for b in pb.blocks
    ]


def commit_blocks_response_to_pb(num_registered: int) -> kvstore_pb2.CommitBlocksResponse:
    """How many blocks a CommitBlocks call registered."""
    return kvstore_pb2.CommitBlocksResponse(num_registered=num_registered)


def reconcile_request_to_pb(
    held_block_ids: Sequence[int], owner: OwnerRef | None = None
) -> kvstore_pb2.ReconcileRequest:
    """A Reconcile request declaring every block reference ``owner`` holds."""
    return kvstore_pb2.ReconcileRequest(held_block_ids=held_block_ids, owner=owner_to_pb(owner))


def reconcile_request_from_pb(pb: kvstore_pb2.ReconcileRequest) -> list[int]:
    """The held block ids of a Reconcile request (a block once per reference)."""
    return list(pb.held_block_ids)


def reconcile_response_to_pb(num_blocks_changed: int) -> kvstore_pb2.ReconcileResponse:
    """How many blocks' reference counts a Reconcile call corrected."""
    return kvstore_pb2.ReconcileResponse(num_blocks_changed=num_blocks_changed)


def reconcile_response_from_pb(pb: kvstore_pb2.ReconcileResponse) -> int:
    """How many blocks' reference counts a Reconcile call corrected."""
    return pb.num_blocks_changed


def kv_stats_to_pb(s: KVStats) -> kvstore_pb2.KVStats:
    """The kvstore's counters as a GetStats answer."""
    return kvstore_pb2.KVStats(
        num_blocks_total=s.num_blocks_total,
        num_blocks_free=s.num_blocks_free,
        num_blocks_used=s.num_blocks_used,
        num_blocks_cached=s.num_blocks_cached,
        prefix_caching_enabled=s.prefix_caching_enabled,
        num_prefix_queries=s.num_prefix_queries,
        num_prefix_query_tokens=s.num_prefix_query_tokens,
        num_prefix_hit_tokens=s.num_prefix_hit_tokens,
        prefix_hit_ratio=s.prefix_hit_ratio,
        num_evictions=s.num_evictions,
        num_owners=s.num_owners,
        owners=[owner_stats_to_pb(o) for o in s.owners],
        recovering=s.recovering,
        num_blocks_evictable=s.num_blocks_evictable,
        pins=pin_stats_to_pb(s.pins),
    )
