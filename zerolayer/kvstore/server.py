"""Thin gRPC handlers of the kvstore."""

from __future__ import annotations

import grpc

from zerolayer.common.convert import (
    advance_pin_clock_request_from_pb,
    advance_pin_clock_response_to_pb,
    allocate_request_from_pb,
    allocate_response_to_pb,
    arena_info_to_pb,
    arena_request_from_pb,
    commit_blocks_request_from_pb,
    commit_blocks_response_to_pb,
    free_request_from_pb,
    free_response_to_pb,
    keep_alive_response_to_pb,
    kv_stats_to_pb,
    lookup_prefix_request_from_pb,
    lookup_prefix_response_to_pb,
    owner_from_pb,
    pin_request_from_pb,
    pin_result_to_pb,
    reconcile_request_from_pb,
    reconcile_result_to_pb,
    register_owner_request_from_pb,
    registration_to_pb,
    release_namespace_pins_request_from_pb,
    release_namespace_pins_response_to_pb,
    release_pin_response_to_pb,
    renew_pin_request_from_pb,
    renew_pin_response_to_pb,
    unregister_owner_response_to_pb,
)
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    """zerolayer.v1.KVStore over a :class:`KVStore`: the block calls go to the store, the
    registrations and keep-alives to its owners (:class:`zerolayer.kvstore.owners.Owners`)."""

    def __init__(self, store: KVStore) -> None:
        self._store = store

    async def GetArena(
        self, request: kvstore_pb2.GetArenaRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.ArenaInfo:
        return arena_info_to_pb(self._store.arena_info(arena_request_from_pb(request)))

    async def RegisterOwner(
        self, request: kvstore_pb2.RegisterOwnerRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.RegisterOwnerResponse:
        owner_id = register_owner_request_from_pb(request)
        return registration_to_pb(self._store.owners.register(owner_id))

    async def KeepAlive(
        self, request: kvstore_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.KeepAliveResponse:
        return keep_alive_response_to_pb(self._store.owners.keep_alive(owner_from_pb(request)))

    async def UnregisterOwner(
        self, request: kvstore_pb2.UnregisterOwnerRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.UnregisterOwnerResponse:
        num_blocks = self._store.unregister(owner_from_pb(request))
        return unregister_owner_response_to_pb(num_blocks)

    async def Allocate(
        self, request: kvstore_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.AllocateResponse:
        num_blocks, admitted_lookup = allocate_request_from_pb(request)
        block_ids = self._store.allocate(num_blocks, owner_from_pb(request), admitted_lookup)
        return allocate_response_to_pb(block_ids)

    async def Free(
        self, request: kvstore_pb2.FreeRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.FreeResponse:
        self._store.free(free_request_from_pb(request), owner_from_pb(request))
        return free_response_to_pb()

    async def LookupPrefix(
        self, request: kvstore_pb2.LookupPrefixRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.LookupPrefixResponse:
        token_ids, cache_salt, counted = lookup_prefix_request_from_pb(request)
        hit = self._store.lookup(token_ids, cache_salt, owner_from_pb(request), counted)
        return lookup_prefix_response_to_pb(hit, self._store.cache.block_size)

    async def CommitBlocks(
        self, request: kvstore_pb2.CommitBlocksRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.CommitBlocksResponse:
        entries = commit_blocks_request_from_pb(request)
        return commit_blocks_response_to_pb(self._store.commit(entries, owner_from_pb(request)))

    async def Reconcile(
        self, request: kvstore_pb2.ReconcileRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.ReconcileResponse:
        held = reconcile_request_from_pb(request)
        return reconcile_result_to_pb(self._store.reconcile(held, owner_from_pb(request)))

    async def GetStats(
        self, request: kvstore_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.KVStats:
        return kv_stats_to_pb(self._store.stats())

    async def Pin(
        self, request: kvstore_pb2.PinRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.PinResponse:
        result = self._store.pin(*pin_request_from_pb(request))
        return pin_result_to_pb(result, self._store.cache.block_size)

    async def RenewPin(
        self, request: kvstore_pb2.RenewPinRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.RenewPinResponse:
        return renew_pin_response_to_pb(self._store.pins.renew(*renew_pin_request_from_pb(request)))

    async def ReleasePin(
        self, request: kvstore_pb2.ReleasePinRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.ReleasePinResponse:
        return release_pin_response_to_pb(self._store.pins.release(request.pin_id))

    async def ReleaseNamespacePins(
        self, request: kvstore_pb2.ReleaseNamespacePinsRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.ReleaseNamespacePinsResponse:
        prefix = release_namespace_pins_request_from_pb(request)
        return release_namespace_pins_response_to_pb(self._store.pins.release_namespaces(prefix))

    async def AdvancePinClock(
        self, request: kvstore_pb2.AdvancePinClockRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.AdvancePinClockResponse:
        advance_s = advance_pin_clock_request_from_pb(request)
        return advance_pin_clock_response_to_pb(self._store.pins.advance_clock(advance_s))
