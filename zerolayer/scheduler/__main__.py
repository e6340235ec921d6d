"""``python -m zerolayer.scheduler --address unix:PATH --loader unix:PATH --kvstore unix:PATH``."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import torch
from prometheus_client import CollectorRegistry

from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.common.clients import fetch_layer_residency, fetch_manifest
from zerolayer.common.config import WARM_UP_PROMPT_TOKENS, SchedulerConfig, default_num_threads
from zerolayer.common.device import resolve_device
from zerolayer.common.layer_main import LayerProgram, main
from zerolayer.common.metrics import serve_metrics
from zerolayer.common.server import LayerServer, ServiceBinding, run_layer
from zerolayer.common.tracing import GEN_AI_REQUEST_MODEL, Tracing
from zerolayer.scheduler.core.engine import Engine, call_in_fresh_thread
from zerolayer.scheduler.core.kv_cache_manager import KVCacheManager
from zerolayer.scheduler.core.scheduler import Scheduler, SchedulingPolicy
from zerolayer.scheduler.gpu_health.watch import watch_gpu
from zerolayer.scheduler.kv_client import KVStoreClient
from zerolayer.scheduler.metrics import SchedulerMetrics
from zerolayer.scheduler.model.device_import import DeviceWeightsView, wait_for_layers
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel
from zerolayer.scheduler.model.model_runner import ModelRunner
from zerolayer.scheduler.model.sampler import Sampler
from zerolayer.scheduler.model.step_inputs import StepBuffers
from zerolayer.scheduler.model.weights import MappedWeights
from zerolayer.scheduler.server import SchedulerServicer
from zerolayer.sharing.handle_kinds import importer_kinds
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)


def build_engine(
    config: SchedulerConfig, tracing: Tracing, registry: CollectorRegistry
) -> tuple[Engine, KVStoreClient]:
    """Maps the weights and the KV arena and assembles the engine (blocking).

    The start-up is one trace: "load weights" (the loader's manifest, then mapping its files) and
    "map kv arena".
    """
    tracer = tracing.tracer
    device = resolve_device(config.device)
    if device.is_cuda:
        torch.cuda.set_device(device.index)
    with tracer.start_as_current_span("load weights") as span:
        with tracing.client_span("/zerolayer.v1.Loader/GetManifest") as metadata:
            manifest = fetch_manifest(
                config.loader_address,
                accepted=importer_kinds(str(device)),
                metadata=metadata,
            )
        model_config = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
        if device.is_cuda:
            if manifest.device_memory is not None:
                # The loader copies layer by layer after its start; map once all are there.
                wait_for_layers(lambda: fetch_layer_residency(config.loader_address))
            weights = DeviceWeightsView(manifest, device)
        else:
            weights = MappedWeights(manifest)
        span.set_attribute("zerolayer.handle_kind", manifest.handle_kind.name)
        model = LlamaModel(model_config, weights.tensors)
        span.set_attribute(GEN_AI_REQUEST_MODEL, manifest.model)
        span.set_attribute("zerolayer.weight_bytes", sum(manifest.file_sizes))
        span.set_attribute("zerolayer.num_tensors", len(manifest.tensors))
    with tracer.start_as_current_span("map kv arena"):
        kv_client = KVStoreClient(config.kvstore_address, tracing=tracing, device=device)
        # NOTE: a fresh scheduler holds no blocks; references left by a predecessor that died
        # are released here (one scheduler per kvstore).
        kv_client.reconcile([])
        layout = kv_client.layout
        if (layout.num_layers, layout.num_kv_heads, layout.head_dim) != (
            model_config.num_hidden_layers,
            model_config.num_key_value_heads,
            model_config.head_dim,
        ):
            raise RuntimeError("the kvstore's arena does not match the loader's model")
        # The csrc kernels are CPU code: on a GPU attention goes through Triton (attention.py).
        kernels = KernelLoader(enabled=config.attention_backend == "native" and not device.is_cuda)
        if config.attention_backend == "native" and not device.is_cuda and kernels.load() is None:
            log.warning(
                "native attention unavailable (%s): using the reference path",
                kernels.unavailable_reason,
            )
        buffers = StepBuffers(
            layout.block_size,
            max_tokens=config.max_num_batched_tokens,
            max_seqs=config.max_num_seqs,
            max_blocks=-(-model_config.max_position_embeddings // layout.block_size),
        )
        runner = ModelRunner(
            model, kv_client.map(), layout.block_size, kernels=kernels, buffers=buffers
        )
    policy = SchedulingPolicy(
        config.max_num_seqs,
        config.max_num_batched_tokens,
        model_config.max_position_embeddings,
        kv_unavailable_timeout_s=config.kv_unavailable_timeout_s,
    )
    kv = KVCacheManager(kv_client, layout.block_size)
    scheduler = Scheduler(policy, kv, model_config.eos_token_ids)

    def gauges() -> dict[str, float]:
        return {
            "requests_running": len(scheduler.running),
            "requests_waiting": len(scheduler.waiting),
            "kv_blocks_held": kv.num_blocks_held,
        }

    metrics = SchedulerMetrics(registry, gauges)
    # NOTE: each weight tensor keeps its file mapping alive (torch.frombuffer holds the mmap).
    return Engine(scheduler, runner, Sampler(), metrics), kv_client


async def serve(config: SchedulerConfig, tracing: Tracing) -> None:
    """Builds the engine, then serves until SIGTERM."""
    torch.set_num_threads(config.num_threads or default_num_threads(len(os.sched_getaffinity(0))))
    registry = serve_metrics(config.metrics_port, host=config.metrics_host, collectors=[])
    holder: dict[str, object] = {}
    servicer = SchedulerServicer(tracing)
    name = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
    server = LayerServer(
        config.address,
        [ServiceBinding(scheduler_pb2_grpc.add_SchedulerServicer_to_server, servicer, name)],
        tracing=tracing,
    )

    async def on_start() -> None:
        # The build runs on a thread that exits and the warm-up on the engine thread, so the
        # engine thread is the only one left with an OpenMP pool (see
        # zerolayer.scheduler.core.engine).
        engine, kv_client = await asyncio.to_thread(
            call_in_fresh_thread, build_engine, config, tracing, registry
        )
        holder["engine"], holder["kv"] = engine, kv_client
        warm_up_s = await asyncio.to_thread(engine.start, WARM_UP_PROMPT_TOKENS)
        log.info("warm-up took %.0f ms", warm_up_s * 1e3)
        servicer.attach(engine)
        stats = engine.stats()
        log.info(
            "engine started with %d torch threads; attention: %s, %d decode CUDA graphs",
            torch.get_num_threads(),
            stats.attention_backend,
            stats.num_cuda_graphs,
        )
        # NOTE: GPU signals and events exist only where the engine runs on a CUDA device with
        # NVML (or with --nvml-script); a fatal GPU event fails the engine and reports
        # NOT_SERVING for good (zerolayer.scheduler.gpu_health.watch).
        device = resolve_device(config.device)
        loop = asyncio.get_running_loop()
        holder["gpu"] = watch_gpu(
            engine,
            registry,
            config.nvml_script,
            device.index if device.is_cuda else None,
            lambda reason: asyncio.run_coroutine_threadsafe(server.stop_serving(reason), loop),
        )

    async def on_stop() -> None:
        for monitor in holder.get("gpu", ()):  # type: ignore[union-attr]
            monitor.stop()
        if "engine" in holder:
            holder["engine"].stop()  # type: ignore[attr-defined]
            holder["kv"].close()  # type: ignore[attr-defined]

    await run_layer(server, on_start=on_start, on_stop=on_stop)


PROGRAM = LayerProgram("scheduler", SchedulerConfig, serve, __doc__)

if __name__ == "__main__":
    sys.exit(main(PROGRAM))
