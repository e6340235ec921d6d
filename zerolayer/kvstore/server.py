"""Thin gRPC handlers of the kvstore."""

from __future__ import annotations

import grpc

from zerolayer.common.convert import (
    allocate_request_from_pb,
    allocate_response_to_pb,
    arena_info_to_pb,
    arena_request_from_pb,
    commit_blocks_request_from_pb,
    commit_blocks_response_to_pb,
    free_request_from_pb,
    free_response_to_pb,
    kv_stats_to_pb,
    lookup_prefix_request_from_pb,
    lookup_prefix_response_to_pb,
    reconcile_request_from_pb,
    reconcile_response_to_pb,
)
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    """zerolayer.v1.KVStore over a :class:`KVStore`."""

    def __init__(self, store: KVStore) -> None:
        self._store = store

    async def GetArena(
        self, request: kvstore_pb2.GetArenaRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.ArenaInfo:
        return arena_info_to_pb(self._store.arena_info(arena_request_from_pb(request)))

    async def Allocate(
        self, request: kvstore_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.AllocateResponse:
        return allocate_response_to_pb(self._store.allocate(allocate_request_from_pb(request)))

    async def Free(
        self, request: kvstore_pb2.FreeRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.FreeResponse:
        self._store.free(free_request_from_pb(request))
        return free_response_to_pb()

    async def LookupPrefix(
        self, request: kvstore_pb2.LookupPrefixRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.LookupPrefixResponse:
        block_ids = self._store.lookup(*lookup_prefix_request_from_pb(request))
        return lookup_prefix_response_to_pb(block_ids, self._store.cache.block_size)

    async def CommitBlocks(
        self, request: kvstore_pb2.CommitBlocksRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.CommitBlocksResponse:
        num_registered = self._store.commit(commit_blocks_request_from_pb(request))
        return commit_blocks_response_to_pb(num_registered)

    async def Reconcile(
        self, request: kvstore_pb2.ReconcileRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.ReconcileResponse:
        changed = self._store.reconcile(reconcile_request_from_pb(request))
        return reconcile_response_to_pb(changed)

    async def GetStats(
        self, request: kvstore_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.KVStats:
        return kv_stats_to_pb(self._store.stats())
