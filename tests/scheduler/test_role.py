"""A scheduler's role: a standby holds its service's health NOT_SERVING until Activate, which
changes nothing else and is idempotent."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.common.convert import activate_response_from_pb
from zerolayer.common.scheduler_role import SchedulerRole
from zerolayer.common.server import LayerServer, ServiceBinding
from zerolayer.scheduler.role import RoleSwitch
from zerolayer.scheduler.server import SchedulerServicer
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc

SERVICE = "zerolayer.v1.Scheduler"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_a_standby_is_activated_once_and_says_how_long_it_waited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    released = []

    async def release() -> None:
        released.append(True)

    now = [100.0]
    role = RoleSwitch(True, release, clock=lambda: now[0])
    now[0] = 112.5
    caplog.set_level(logging.INFO, logger="zerolayer.scheduler.role")
    previous = [asyncio.run(role.activate()), asyncio.run(role.activate())]
    assert previous == [SchedulerRole.STANDBY, SchedulerRole.ACTIVE]
    assert (role.role, released) == (SchedulerRole.ACTIVE, [True])
    assert [r.getMessage() for r in caplog.records] == ["activated after 12.5 s as a standby"]


def test_an_active_scheduler_stays_active_and_releases_nothing() -> None:
    async def release() -> None:
        raise AssertionError("an active scheduler holds no service")

    role = RoleSwitch(False, release)
    assert asyncio.run(role.activate()) is SchedulerRole.ACTIVE
    assert role.role is SchedulerRole.ACTIVE


def test_activate_over_grpc_turns_the_standby_service_serving(tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 'scheduler.sock'}"

    async def run() -> list[object]:
        # As the scheduler's serve() assembles them.
        role = RoleSwitch(True, lambda: server.release_service(SERVICE))
        binding = ServiceBinding(
            scheduler_pb2_grpc.add_SchedulerServicer_to_server, SchedulerServicer(role), SERVICE
        )
        server = LayerServer(address, [binding], held_services=(SERVICE,))
        await server.start()
        await server.set_serving(True)  # warmed
        seen: list[object] = []
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            stub = scheduler_pb2_grpc.SchedulerStub(channel)

            async def statuses() -> list[int]:
                checks = [health_pb2.HealthCheckRequest(service=s) for s in ("", SERVICE)]
                return [(await health.Check(c, timeout=5)).status for c in checks]

            seen.append(await statuses())
            for _ in range(2):
                answer = await stub.Activate(scheduler_pb2.ActivateRequest(), timeout=5)
                seen.append(activate_response_from_pb(answer))
            seen.append(await statuses())
        await server.stop(0)
        return seen

    assert asyncio.run(run()) == [
        [SERVING, NOT_SERVING],
        SchedulerRole.STANDBY,
        SchedulerRole.ACTIVE,
        [SERVING, SERVING],
    ]
