"""The scheduler process's engine: the weights from the loader, the KV arena and the block pool
from the kvstore, assembled by :func:`zerolayer.scheduler.engine_factory.assemble_engine`.

The start-up is one trace, rooted at a "start-up" span: its children "load weights" (the loader's
manifest, then mapping its files or importing its device memory) and "map kv arena" (the kvstore's
arena, then the engine built on it).
"""

from __future__ import annotations

import grpc
import torch
from prometheus_client import CollectorRegistry

from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.common.clients import fetch_layer_residency, fetch_manifest
from zerolayer.common.config import SchedulerConfig
from zerolayer.common.device import Device, resolve_device
from zerolayer.common.errors import FailedPrecondition
from zerolayer.common.tracing import GEN_AI_REQUEST_MODEL, Tracing
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.engine_factory import EngineConfig, EngineParts, assemble_engine
from zerolayer.scheduler.kv_client import KVStoreClient
from zerolayer.scheduler.metrics import register_model_info
from zerolayer.scheduler.model.device_import import DeviceWeightsView, wait_for_layers
from zerolayer.scheduler.model.weights import MappedWeights
from zerolayer.sharing.handle_kinds import importer_kinds
from zerolayer.sharing.manifest import WeightManifest


class ManifestRefused(FailedPrecondition):
    """The loader cannot hand out its manifest (FAILED_PRECONDITION): restarting will not help."""


def build_serving_engine(
    config: SchedulerConfig, tracing: Tracing, registry: CollectorRegistry
) -> tuple[Engine, KVStoreClient]:
    """Maps the weights and the KV arena and assembles the engine (blocking; not started).

    Returns:
        The engine and its kvstore client (to close after the engine stops).

    Raises:
        ValueError: ``config.device`` does not exist here, or the kvstore's arena does not
            match the loader's model (see :func:`assemble_engine`).
        grpc.RpcError: the loader or the kvstore did not answer.
    """
    device = resolve_device(config.device)
    if device.is_cuda:
        torch.cuda.set_device(device.index)
    with tracing.tracer.start_as_current_span("start-up"):
        model_config, weights, quant_types, manifest = load_weights(
            config.loader_address, device, tracing
        )
        register_model_info(registry, manifest.model, manifest.fingerprint)
        with tracing.tracer.start_as_current_span("map kv arena"):
            kv_client = KVStoreClient(
                config.kvstore_address, tracing=tracing, device=device, owner_id=config.kv_owner_id
            )
            # NOTE: a fresh scheduler registers (a new epoch of its owner id) and holds no
            # blocks; references left by a predecessor with the same owner id are released here,
            # other schedulers' are not.
            kv_client.reconcile([])
            arena = kv_client.map()
            parts = EngineParts(
                model_config,
                weights,
                kv_client,
                arena,
                kv_client.layout,
                device,
                manifest.tokenizer_json,
                quant_types,
            )
            return assemble_engine(parts, EngineConfig.of(config), registry), kv_client


def load_weights(
    loader_address: str, device: Device, tracing: Tracing
) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, str] | None, WeightManifest]:
    """The loader's model: its config, its weight tensors on ``device`` (views of the files
    the loader mapped, or of the device memory it exports; never a copy unless the loader offers
    only files to a GPU), a GGUF file's tensor types (``MappedWeights.model_quant_types``; None
    for other checkpoints and on a GPU) and its manifest (served name, fingerprint,
    tokenizer.json text), in a "load weights" span.

    Raises:
        grpc.RpcError: the loader did not answer.
        ManifestRefused: the loader answered FAILED_PRECONDITION (e.g. a weight file changed in
            place under it, or no handle kind in common).
        WeightFileChanged: a weight file at the manifest's path is not the one the loader mapped.
        Unavailable: the loader's device copy was not complete within 10 minutes.
    """
    with tracing.tracer.start_as_current_span("load weights") as span:
        with tracing.client_span("/zerolayer.v1.Loader/GetManifest") as metadata:
            try:
                manifest = fetch_manifest(
                    loader_address, accepted=importer_kinds(str(device)), metadata=metadata
                )
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                raise ManifestRefused(f"the loader refused GetManifest: {exc.details()}") from None
        model_config = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
        if device.is_cuda:
            if manifest.device_memory is not None:
                # The loader copies layer by layer after its start; map once all are there.
                wait_for_layers(lambda: fetch_layer_residency(loader_address))
            weights = DeviceWeightsView(manifest, device)
        else:
            weights = MappedWeights(manifest)
        span.set_attribute("zerolayer.handle_kind", manifest.handle_kind.name)
        span.set_attribute(GEN_AI_REQUEST_MODEL, manifest.model)
        span.set_attribute("zerolayer.weight_bytes", sum(manifest.file_sizes))
        span.set_attribute("zerolayer.num_tensors", len(manifest.tensors))
    # NOTE: each tensor keeps its file mapping (or its device allocation) alive.
    quant_types = weights.model_quant_types if isinstance(weights, MappedWeights) else None
    return model_config, weights.tensors, quant_types, manifest
