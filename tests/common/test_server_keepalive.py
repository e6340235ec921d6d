"""The servers' keepalive policy: a client that pings every second (as many gRPC clients do for
long streams) keeps its connection, with a call waiting for data and with none at all."""

from __future__ import annotations

import asyncio
import socket

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.common.server import LayerServer

CLIENT_KEEPALIVE_OPTIONS = (
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),  # NOTE: 0 = no limit: ping however long it waits
)
"""A client that pings every 1 s, during calls and between them."""
HOLD_S = 6.0
"""How long the connections stay open; gRPC's default policy sends GOAWAY within about 4 s."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def hold_connections(address: str) -> tuple[bool, str, str]:
    """Two connections pinging every second for :data:`HOLD_S` seconds, one with a health Watch
    waiting for data and one idle; returns whether the Watch is still open, and each
    channel's state at the end."""
    options = CLIENT_KEEPALIVE_OPTIONS
    async with (
        grpc.aio.insecure_channel(address, options=options) as busy,
        grpc.aio.insecure_channel(address, options=options) as idle,
    ):
        request = health_pb2.HealthCheckRequest(service="")
        watch = health_pb2_grpc.HealthStub(busy).Watch(request)
        await watch.read()  # the first status; no more data comes while it holds
        await health_pb2_grpc.HealthStub(idle).Check(request, timeout=5)
        await asyncio.sleep(HOLD_S)
        open_ = not watch.done()
        watch.cancel()
        return open_, busy.get_state().name, idle.get_state().name


def test_clients_pinging_every_second_keep_their_connection_with_a_call_waiting_or_idle() -> None:
    address = f"127.0.0.1:{free_port()}"

    async def run() -> tuple[bool, str, str]:
        server = LayerServer(address, [])
        await server.start()
        try:
            return await hold_connections(address)
        finally:
            await server.stop(0)

    assert asyncio.run(run()) == (True, "READY", "READY")
