"""Thin gRPC handlers of the loader."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from zerolayer.common.convert import manifest_request_from_pb, manifest_to_pb, residency_to_pb
from zerolayer.common.errors import Unavailable
from zerolayer.loader.weight_store import WeightStore
from zerolayer.sharing.handle_kinds import negotiate
from zerolayer.sharing.manifest import HandleKind, Residency
from zerolayer.v1 import loader_pb2, loader_pb2_grpc

if TYPE_CHECKING:
    from zerolayer.loader.device_weights import DeviceWeights


class LoaderServicer(loader_pb2_grpc.LoaderServicer):
    """zerolayer.v1.Loader over a :class:`WeightStore`.

    Before serving the files (GetManifest for HANDLE_KIND_MMAP_FILE, GetResidency on CPU,
    Prefetch) it checks that none changed in place: FAILED_PRECONDITION naming the file otherwise,
    so a truncated file is reported, never handed out or touched. The device copy, once made, no
    longer depends on the files and is still handed out.
    """

    def __init__(self, store: WeightStore, device_weights: DeviceWeights | None = None) -> None:
        """
        Args:
            store: the file mappings (always offered as HANDLE_KIND_MMAP_FILE).
            device_weights: the device copy when the loader runs on a GPU (offered with its
                handle kind, which importers on that GPU prefer).
        """
        self._store = store
        self._device = device_weights

    async def GetManifest(
        self, request: loader_pb2.GetManifestRequest, context: grpc.aio.ServicerContext
    ) -> loader_pb2.ModelManifest:
        model, accepted = manifest_request_from_pb(request)
        offered = [HandleKind.MMAP_FILE]
        if self._device is not None:
            offered.insert(0, self._device.handle.kind)
        kind = negotiate(accepted, offered)
        if kind == HandleKind.MMAP_FILE:
            self._store.check_unchanged()
        manifest = self._store.get_manifest(model, [HandleKind.MMAP_FILE])
        if kind != HandleKind.MMAP_FILE and self._device is not None:
            manifest = self._device.manifest_for(manifest)
        return manifest_to_pb(manifest)

    async def GetResidency(
        self, request: loader_pb2.GetResidencyRequest, context: grpc.aio.ServicerContext
    ) -> loader_pb2.Residency:
        return residency_to_pb(self._residency())

    async def Prefetch(
        self, request: loader_pb2.PrefetchRequest, context: grpc.aio.ServicerContext
    ) -> loader_pb2.Residency:
        self._store.check_unchanged()
        self._store.prefetch()
        return residency_to_pb(self._residency())

    def _residency(self) -> Residency:
        total, resident = self._store.residency()
        num_layers = self._store.model_config.num_hidden_layers
        if self._device is None:
            self._store.check_unchanged()
            return Residency(
                total_bytes=total,
                resident_bytes=resident,
                num_layers=num_layers,
                num_layers_resident=num_layers,
                device="cpu",
            )
        if self._device.error is not None:
            raise Unavailable(f"copying the weights to the device failed: {self._device.error}")
        return Residency(
            total_bytes=total,
            resident_bytes=resident,
            num_layers=num_layers,
            num_layers_resident=self._device.num_layers_resident,
            device=self._device.handle.device,
        )
