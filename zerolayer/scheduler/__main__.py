"""``python -m zerolayer.scheduler --address unix:PATH --loader unix:PATH --kvstore unix:PATH``."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from zerolayer.scheduler.openmp_waiting import default_openmp_waiting

# NOTE: before torch loads libgomp, which reads its environment once (see openmp_waiting).
OPENMP_WAITING = default_openmp_waiting(os.environ)

import grpc
import torch
from prometheus_client import CollectorRegistry

from zerolayer.common.config import (
    WARM_UP_PROMPT_TOKENS,
    SchedulerConfig,
    default_num_threads,
)
from zerolayer.common.device import resolve_device
from zerolayer.common.layer_main import LayerProgram, main
from zerolayer.common.metrics import serve_metrics
from zerolayer.common.server import CHANNEL_OPTIONS, LayerServer, ServiceBinding, run_layer
from zerolayer.common.settings import LOADER_ADDRESS
from zerolayer.common.tracing import Tracing
from zerolayer.scheduler.core.engine import Engine, call_in_fresh_thread
from zerolayer.scheduler.gpu_health.watch import watch_gpu
from zerolayer.scheduler.kv_client import KVStoreClient
from zerolayer.scheduler.kv_health import KVStoreReadiness
from zerolayer.scheduler.metrics import register_serving
from zerolayer.scheduler.role import RoleSwitch
from zerolayer.scheduler.server import SchedulerServicer
from zerolayer.scheduler.startup import ManifestRefused, build_serving_engine
from zerolayer.sharing.file_identity import WeightFileChanged
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)


def build_engine(
    config: SchedulerConfig, tracing: Tracing, registry: CollectorRegistry
) -> tuple[Engine, KVStoreClient]:
    """Maps the weights and the KV arena and assembles the engine (blocking); see
    :func:`zerolayer.scheduler.startup.build_serving_engine`."""
    return build_serving_engine(config, tracing, registry)


async def serve(config: SchedulerConfig, tracing: Tracing) -> None:
    """Builds the engine, then serves until SIGTERM."""
    torch.set_num_threads(config.num_threads or default_num_threads(len(os.sched_getaffinity(0))))
    registry = serve_metrics(config.metrics_port, host=config.metrics_host, collectors=[])
    holder: dict[str, object] = {}
    name = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
    # NOTE: a standby holds its service's health NOT_SERVING until Activate releases it.
    role = RoleSwitch(config.standby, lambda: server.release_service(name))
    servicer = SchedulerServicer(role, tracing, outage=lambda: server.outage(name))
    server = LayerServer(
        config.address,
        [ServiceBinding(scheduler_pb2_grpc.add_SchedulerServicer_to_server, servicer, name)],
        tracing=tracing,
        held_services=(name,) if config.standby else (),
    )
    register_serving(registry, lambda: server.is_serving(name))

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
        # NOTE: started once the engine serves: before, the kvstore's state is start-up's.
        channel = grpc.aio.insecure_channel(config.kvstore_address, options=CHANNEL_OPTIONS)
        readiness = KVStoreReadiness(
            channel,
            config.kv_unavailable_timeout_s,
            lambda reason: server.set_outage(name, reason),
        )
        holder["kv_channel"] = channel
        holder["kv_readiness"] = asyncio.create_task(readiness.follow(), name="kvstore health")
        stats = engine.stats()
        log.info(
            "engine started with %d torch threads (%s); attention: %s, %d decode CUDA graphs; %s",
            torch.get_num_threads(),
            OPENMP_WAITING,
            stats.attention_backend,
            stats.num_cuda_graphs,
            role.role.name.lower(),
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
        if "kv_readiness" in holder:
            holder["kv_readiness"].cancel()  # type: ignore[attr-defined]
            await holder["kv_channel"].close()  # type: ignore[attr-defined]
        for monitor in holder.get("gpu", ()):  # type: ignore[union-attr]
            monitor.stop()
        if "engine" in holder:
            holder["engine"].stop()  # type: ignore[attr-defined]
            holder["kv"].close()  # type: ignore[attr-defined]

    await run_layer(server, on_start=on_start, on_stop=on_stop)


PROGRAM = LayerProgram(
    "scheduler",
    SchedulerConfig,
    serve,
    __doc__,
    # A weight file replaced or truncated under the loader: one line, not a traceback.
    setting_errors=((ManifestRefused, LOADER_ADDRESS), (WeightFileChanged, LOADER_ADDRESS)),
)

if __name__ == "__main__":
    sys.exit(main(PROGRAM))
