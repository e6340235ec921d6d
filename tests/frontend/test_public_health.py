"""The frontend's serving gauge follows its public gRPC health: 1 while the public names say
SERVING (the frontend serves and some scheduler takes requests), 0 otherwise."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from zerolayer.common.server import ServiceBinding
from zerolayer.frontend.metrics import FrontendMetrics
from zerolayer.frontend.public_health import FrontendServer
from zerolayer.v1 import generation_pb2_grpc

SERVICE = "zerolayer.v1.TextGeneration"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_the_serving_gauge_says_what_the_public_health_says(tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 'f.sock'}"
    registry = CollectorRegistry()
    metrics = FrontendMetrics(registry)
    scheduler_ready = [False]
    binding = ServiceBinding(
        generation_pb2_grpc.add_TextGenerationServicer_to_server,
        generation_pb2_grpc.TextGenerationServicer(),
        SERVICE,
    )

    def gauge() -> float | None:
        return registry.get_sample_value("zerolayer_frontend_serving")

    async def seen() -> tuple[int, float | None]:
        async with grpc.aio.insecure_channel(address) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            return (
                await check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            ).status, gauge()

    async def run() -> list[tuple[int, float | None]]:
        server = FrontendServer(
            address,
            [binding],
            ready=lambda: scheduler_ready[0],
            on_public_health=metrics.serving.set,
        )
        await server.start()
        states = [await seen()]
        await server.set_serving(True)  # no scheduler takes requests yet
        states.append(await seen())
        scheduler_ready[0] = True
        await server.refresh_health()
        states.append(await seen())
        scheduler_ready[0] = False
        await server.refresh_health()
        states.append(await seen())
        scheduler_ready[0] = True
        await server.refresh_health()
        await server.set_serving(False)  # shutting down
        states.append(await seen())
        await server.stop(0)
        return states

    assert asyncio.run(run()) == [
        (NOT_SERVING, 0),
        (NOT_SERVING, 0),
        (SERVING, 1),
        (NOT_SERVING, 0),
        (NOT_SERVING, 0),
    ]
