"""Thin gRPC handlers of the kvstore."""

from __future__ import annotations

import grpc

from services.kvstore.kv_store import KVStore
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    """zerolayer.v1.KVStore over a :class:`KVStore`."""

    def __init__(self, store: KVStore) -> None:
        self._store = store

    async def GetArena(
        self, request: kvstore_pb2.GetArenaRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.ArenaInfo:
        arena = self._store.arena
        layout = arena.layout
        return kvstore_pb2.ArenaInfo(
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

    async def GetStats(
        self, request: kvstore_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.KVStats:
        s = self._store.stats()
        return kvstore_pb2.KVStats(
            num_blocks_total=s.num_blocks_total,
            num_blocks_free=s.num_blocks_free,
            num_blocks_used=s.num_blocks_used,
        )

    async def Reconcile(self, request: kvstore_pb2.ReconcileRequest,
                        context: grpc.aio.ServicerContext) -> kvstore_pb2.ReconcileResponse:
        changed = self._store.reconcile(list(request.held_block_ids))
        return kvstore_pb2.ReconcileResponse(num_blocks_changed=changed)
