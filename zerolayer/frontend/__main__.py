"""``python -m zerolayer.frontend --listen HOST:PORT --loader unix:PATH --scheduler unix:PATH``."""

from __future__ import annotations

import asyncio
import sys

from zerolayer.common.clients import fetch_manifest
from zerolayer.common.config import FrontendConfig
from zerolayer.common.layer_main import LayerProgram, main
from zerolayer.common.metrics import serve_metrics
from zerolayer.common.server import LayerServer, ServiceBinding, run_layer
from zerolayer.common.tracing import Tracing
from zerolayer.frontend.generation import TextGenerator
from zerolayer.frontend.kserve import kserve_binding
from zerolayer.frontend.metrics import FrontendMetrics, RequestCountingInterceptor
from zerolayer.frontend.scheduler_client import SchedulerClient
from zerolayer.frontend.server import TextGenerationServicer
from zerolayer.v1 import generation_pb2, generation_pb2_grpc

PUBLIC_MAX_RECEIVE_BYTES = 8 * 1024 * 1024
"""Largest public request accepted; prompts are far smaller (see validation.check_text_length)."""


async def serve(config: FrontendConfig, tracing: Tracing) -> None:
    """Loads the tokenizer from the loader, then serves until SIGTERM."""
    manifest = await asyncio.to_thread(fetch_manifest, config.loader_address)
    scheduler = SchedulerClient(config.scheduler_address, tracing=tracing)
    metrics = FrontendMetrics(
        serve_metrics(config.metrics_port, host=config.metrics_host, collectors=[])
    )
    generator = TextGenerator(config, manifest, scheduler, tracing.tracer, metrics)
    name = generation_pb2.DESCRIPTOR.services_by_name["TextGeneration"].full_name
    server = LayerServer(
        config.listen,
        [
            ServiceBinding(
                generation_pb2_grpc.add_TextGenerationServicer_to_server,
                TextGenerationServicer(generator),
                name,
            ),
            kserve_binding(generator),
        ],
        max_receive_bytes=PUBLIC_MAX_RECEIVE_BYTES,
        tracing=tracing,
        interceptors=[RequestCountingInterceptor(metrics, ("/zerolayer.", "/inference."))],
        instance_id=config.instance_id,
        reuse_port=config.reuse_port,
    )

    async def on_stop() -> None:
        await scheduler.close()

    await run_layer(server, on_stop=on_stop)


PROGRAM = LayerProgram("frontend", FrontendConfig, serve, __doc__)

if __name__ == "__main__":
    sys.exit(main(PROGRAM))
