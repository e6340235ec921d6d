"""The frontend's watch of a scheduler's ``grpc.health.v1`` status, reported to the router.

Two ``Watch`` streams per scheduler (pushed by the scheduler, not polled): the service name
``zerolayer.v1.Scheduler`` (SERVING: it takes requests) and "" (SERVING: the process is up and
warmed; a standby reports only this one). A stream that breaks (the scheduler died or restarts)
reports the scheduler down at once and is opened again with ``wait_for_ready``, so it resumes as
soon as the channel reconnects (within about a second of a restarted scheduler listening, see
``CHANNEL_OPTIONS``). Spec: https://github.com/grpc/grpc/blob/master/doc/health-checking.md
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health_pb2_grpc

from zerolayer.common.convert import health_request_to_pb, serving_from_health_pb
from zerolayer.frontend.routing.router import SCHEDULER_SERVICE, Router

WATCHED = {SCHEDULER_SERVICE: "active", "": "warm"}
"""Health name -> the :meth:`Router.set_health` field it sets."""
MIN_RETRY_S, MAX_RETRY_S = 0.05, 1.0
"""Pause before opening a stream that ended again, doubling from the first to the second."""


class HealthWatcher:
    """Follows one scheduler's health names on ``channel`` and reports them to ``router``."""

    def __init__(self, channel: grpc.aio.Channel, address: str, router: Router) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)
        self._address = address
        self._router = router
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Starts one task per watched name on the running loop."""
        self._tasks = [
            asyncio.create_task(self._follow(service, field), name=f"health {service!r}")
            for service, field in WATCHED.items()
        ]

    def restart(self) -> None:
        """Opens the streams afresh: the scheduler answers with its current status."""
        for task in self._tasks:
            task.cancel()
        self.start()

    async def close(self) -> None:
        """Stops following."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self, service: str, field: str) -> None:
        retry_s = MIN_RETRY_S
        while True:
            call = self._stub.Watch(health_request_to_pb(service), wait_for_ready=True)
            try:
                async for pb in call:
                    self._router.set_health(self._address, **{field: serving_from_health_pb(pb)})
                    retry_s = MIN_RETRY_S
            except grpc.aio.AioRpcError:
                pass  # the scheduler went away (or never came): down until it answers again
            finally:
                call.cancel()
            self._router.set_health(self._address, **{field: False})
            await asyncio.sleep(retry_s)
            retry_s = min(2 * retry_s, MAX_RETRY_S)
