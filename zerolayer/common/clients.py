"""Client-side helpers for calls between layers."""

from __future__ import annotations

import grpc

from zerolayer.common.convert import (
    manifest_from_pb,
    manifest_request_to_pb,
    residency_from_pb,
    residency_request_to_pb,
)
from zerolayer.common.server import CHANNEL_OPTIONS
from zerolayer.sharing.manifest import HandleKind, WeightManifest
from zerolayer.sharing.manifest import model_dtype_name as model_dtype_name  # the old home
from zerolayer.v1 import loader_pb2_grpc


def fetch_manifest(
    loader_address: str,
    timeout_s: float = 60.0,
    accepted: tuple[HandleKind, ...] = (HandleKind.MMAP_FILE,),
    metadata: list[tuple[str, str]] | None = None,
) -> WeightManifest:
    """Asks the loader for the model manifest, waiting up to ``timeout_s`` for it to come up.

    Raises:
        grpc.RpcError: the loader did not answer in time (UNAVAILABLE / DEADLINE_EXCEEDED) or
            refused (NOT_FOUND, FAILED_PRECONDITION).
    """
    with grpc.insecure_channel(loader_address, options=CHANNEL_OPTIONS) as channel:
        stub = loader_pb2_grpc.LoaderStub(channel)
        pb = stub.GetManifest(
            manifest_request_to_pb(accepted),
            timeout=timeout_s,
            wait_for_ready=True,
            metadata=metadata,
        )
    return manifest_from_pb(pb)


def fetch_layer_residency(loader_address: str, timeout_s: float = 10.0) -> tuple[int, int]:
    """(num_layers_resident, num_layers) of the loader's weights on its device.

    Raises:
        grpc.RpcError: the loader did not answer, or its device copy failed (UNAVAILABLE).
    """
    with grpc.insecure_channel(loader_address, options=CHANNEL_OPTIONS) as channel:
        pb = loader_pb2_grpc.LoaderStub(channel).GetResidency(
            residency_request_to_pb(), timeout=timeout_s, wait_for_ready=True
        )
    residency = residency_from_pb(pb)
    return residency.num_layers_resident, residency.num_layers
