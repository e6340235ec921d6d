"""Thin gRPC handlers of the loader."""

from __future__ import annotations

import grpc

from services.common.convert import manifest_to_pb
from services.common.manifest import HandleKind
from services.loader.weight_store import WeightStore
from zerolayer.v1 import loader_pb2, loader_pb2_grpc


class LoaderServicer(loader_pb2_grpc.LoaderServicer):
    """zerolayer.v1.Loader over a :class:`WeightStore`."""

    def __init__(self, store: WeightStore) -> None:
        self._store = store

    async def GetManifest(
        self, request: loader_pb2.GetManifestRequest, context: grpc.aio.ServicerContext
    ) -> loader_pb2.ModelManifest:
        accepted = [HandleKind(k) for k in request.accepted_handle_kinds]
        return manifest_to_pb(self._store.get_manifest(request.model, accepted))

    async def GetResidency(
        self, request: loader_pb2.GetResidencyRequest, context: grpc.aio.ServicerContext
    ) -> loader_pb2.Residency:
        total, resident = self._store.residency()
        return loader_pb2.Residency(total_bytes=total, resident_bytes=resident)

    async def Prefetch(
        self, request: loader_pb2.PrefetchRequest, context: grpc.aio.ServicerContext
    ) -> loader_pb2.Residency:
        self._store.prefetch()
        total, resident = self._store.residency()
        return loader_pb2.Residency(total_bytes=total, resident_bytes=resident)
