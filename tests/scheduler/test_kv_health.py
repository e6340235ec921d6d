"""The scheduler's readiness follows its kvstore: NOT_SERVING once the kvstore has been unusable
(NOT_SERVING or not answering) for ``kv_unavailable_timeout_s``, back as soon as it answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from zerolayer.scheduler.kv_health import KVStoreReadiness

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TIMEOUT_S = 2.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def scenario(address: str) -> list[str]:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(address)
    await server.start()
    await servicer.set("", SERVING)
    reported: list[str] = []

    async def on_change(reason: str) -> None:
        reported.append(reason)

    clock = Clock()
    async with grpc.aio.insecure_channel(address) as channel:
        readiness = KVStoreReadiness(channel, TIMEOUT_S, on_change, clock)
        await readiness.check()
        assert readiness.reason == "" and reported == []

        await servicer.set("", NOT_SERVING)  # e.g. a restarted kvstore still recovering
        await readiness.check()
        clock.now += TIMEOUT_S - 0.1
        await readiness.check()
        assert reported == []  # requests still wait for it: they may yet be served

        clock.now += 0.1
        await readiness.check()
        assert reported == [readiness.reason]
        assert "kvstore: unusable for more than 2 s" in readiness.reason

        await servicer.set("", SERVING)
        await readiness.check()
        assert reported[-1] == "" and readiness.reason == ""

        await server.stop(0)  # gone: a check that gets no answer is an unusable kvstore
        await readiness.check()
        clock.now += TIMEOUT_S
        await readiness.check()
        assert len(reported) == 3 and reported[-1].startswith("kvstore: unusable")
        await readiness.check()
        assert len(reported) == 3  # reported once per change
    return reported


def test_reason_set_after_the_timeout_and_cleared_when_back(tmp_path: Path) -> None:
    asyncio.run(scenario(f"unix:{tmp_path / 'kvstore.sock'}"))
