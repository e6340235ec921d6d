"""Thin gRPC handlers of the kvstore."""

from __future__ import annotations

import grpc

from zerolayer.common.convert import device_memory_to_pb
from zerolayer.kv.commit import CommitEntry
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.sharing.handle_kinds import negotiate
from zerolayer.sharing.manifest import HandleKind
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc

_KNOWN_KINDS = frozenset(int(k) for k in HandleKind)


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    """zerolayer.v1.KVStore over a :class:`KVStore`."""

    def __init__(self, store: KVStore) -> None:
        self._store = store

    async def GetArena(
        self, request: kvstore_pb2.GetArenaRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.ArenaInfo:
        arena = self._store.arena
        layout = arena.layout
        accepted = [HandleKind(k) for k in request.accepted_handle_kinds if k in _KNOWN_KINDS]
        device_memory = None
        handle = getattr(arena, "handle", None)  # a DeviceArena's (GPU)
        if handle is not None:
            kind = negotiate(accepted, [handle.kind])
            device_memory = device_memory_to_pb(handle)
        else:
            kind = negotiate(accepted, [HandleKind.MMAP_FILE])
        return kvstore_pb2.ArenaInfo(
            device="cpu" if handle is None else handle.device,
            handle_kind=int(kind),
            device_memory=device_memory,
            shm_path=arena.path,
            size_bytes=layout.size_bytes,
            num_blocks=layout.num_blocks,
            block_size=layout.block_size,
            num_layers=layout.num_layers,
            num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim,
            dtype=layout.dtype,
            block_bytes=layout.block_bytes,
            arena_id=arena.arena_id,
        )

    async def Allocate(
        self, request: kvstore_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.AllocateResponse:
        return kvstore_pb2.AllocateResponse(block_ids=self._store.allocate(request.num_blocks))

    async def Free(
        self, request: kvstore_pb2.FreeRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.FreeResponse:
        self._store.free(list(request.block_ids))
        return kvstore_pb2.FreeResponse()

    async def LookupPrefix(
        self, request: kvstore_pb2.LookupPrefixRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.LookupPrefixResponse:
        block_ids = self._store.lookup(request.token_ids, request.cache_salt)
        return kvstore_pb2.LookupPrefixResponse(
            block_ids=block_ids, num_cached_tokens=len(block_ids) * self._store.cache.block_size
        )

    async def CommitBlocks(
        self, request: kvstore_pb2.CommitBlocksRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.CommitBlocksResponse:
        entries = [
            CommitEntry(
                b.block_id,
                b.parent_block_id if b.HasField("parent_block_id") else None,
                tuple(b.token_ids),
                b.cache_salt,
            )
            for b in request.blocks
        ]
        return kvstore_pb2.CommitBlocksResponse(num_registered=self._store.commit(entries))

    async def Reconcile(
        self, request: kvstore_pb2.ReconcileRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.ReconcileResponse:
        changed = self._store.reconcile(list(request.held_block_ids))
        return kvstore_pb2.ReconcileResponse(num_blocks_changed=changed)

    async def GetStats(
        self, request: kvstore_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.KVStats:
        s = self._store.stats()
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
        )
