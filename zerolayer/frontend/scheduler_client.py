"""The frontend's asynchronous client of one scheduler: its Generate stream, its block size, and
its health, which it follows for the router (:mod:`zerolayer.frontend.health_client`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import nullcontext
from dataclasses import dataclass

import grpc

from zerolayer.common.convert import (
    block_size_from_stats_pb,
    engine_request_to_pb,
    not_serving_reason_from_stats_pb,
    request_output_from_pb,
    role_from_stats_pb,
    scheduler_stats_request_to_pb,
)
from zerolayer.common.errors import SchedulerLost, Unavailable
from zerolayer.common.generation import EngineRequest, RequestOutput
from zerolayer.common.scheduler_role import SchedulerRole
from zerolayer.common.server import CHANNEL_OPTIONS
from zerolayer.common.status import answered_by_handler
from zerolayer.common.tracing import Tracing
from zerolayer.frontend.health_client import HealthWatcher
from zerolayer.frontend.public_errors import public_message
from zerolayer.frontend.router import Router
from zerolayer.v1 import scheduler_pb2_grpc

log = logging.getLogger(__name__)

LOST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
"""Codes of a call whose scheduler went away, when no handler chose them: unreachable, the
connection broke (UNAVAILABLE), or the server cancelled the call as it shut down (CANCELLED)."""


@dataclass(frozen=True)
class SelfReport:
    """What a scheduler says of itself (GetStats)."""

    role: SchedulerRole
    """ACTIVE or STANDBY (UNSPECIFIED: a scheduler that predates roles)."""
    not_serving_reason: str
    """Why it stopped serving while it runs; "" when it serves or did not say."""

    def describe(self) -> str:
        """In words, for a scheduler that is up but takes no requests: ``not serving`` when it
        says why (or is the active one), ``standby`` only when its role is that."""
        if self.role == SchedulerRole.STANDBY and not self.not_serving_reason:
            return "standby"
        return "not serving"


class SchedulerClient:
    """Streams engine outputs from one scheduler; closing the stream early cancels the call, which
    aborts the request in the scheduler and frees its KV blocks."""

    def __init__(self, address: str, tracing: Tracing | None = None) -> None:
        """
        Args:
            address: the scheduler's gRPC address.
            tracing: a CLIENT span around each call, its context sent in the call's metadata.
        """
        self.address = address
        self._tracing = tracing
        self._channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._health: HealthWatcher | None = None

    def watch_health(self, router: Router) -> None:
        """Starts reporting this scheduler's health to ``router`` (on the running loop), over
        the channel the calls use, so a broken connection shows in both at once."""
        self._health = HealthWatcher(self._channel, self.address, router)
        self._health.start()

    def watch_again(self) -> None:
        """Asks the scheduler's health afresh (after a call found it gone while the health
        stream said nothing yet); a scheduler that still serves reports SERVING again."""
        if self._health is not None:
            self._health.restart()

    async def generate(
        self, request: EngineRequest, timeout_s: float | None
    ) -> AsyncIterator[RequestOutput]:
        """Yields the request's outputs until the finished one.

        Raises:
            SchedulerLost: the scheduler cannot be reached or went away (see :data:`LOST_CODES`).
            Unavailable: the scheduler answered UNAVAILABLE itself (its kvstore is down, its GPU
                failed).
            grpc.aio.AioRpcError: the scheduler rejected the request (INVALID_ARGUMENT,
                RESOURCE_EXHAUSTED) or the deadline passed.
        """
        with (
            self._tracing.client_span("/zerolayer.v1.Scheduler/Generate")
            if self._tracing is not None
            else nullcontext(None)
        ) as metadata:
            # NOTE: on a connected channel the request is on its way as soon as the call starts:
            # a failure from then on may mean the scheduler died carrying it.
            carrying = self._channel.get_state() == grpc.ChannelConnectivity.READY
            call = self._stub.Generate(
                engine_request_to_pb(request), timeout=timeout_s, metadata=metadata
            )
            try:
                async for pb in call:
                    carrying = True
                    yield request_output_from_pb(request.request_id, pb)
            except grpc.aio.AioRpcError as exc:
                raise _error_of(exc, self.address, carrying) from None
            finally:
                call.cancel()

    async def block_size(self) -> int:
        """The KV block size the scheduler runs with (0 if it is unreachable)."""
        try:
            stats = await self._stub.GetStats(scheduler_stats_request_to_pb(), timeout=5)
        except grpc.aio.AioRpcError:
            return 0
        return block_size_from_stats_pb(stats)

    async def self_report(self) -> SelfReport | None:
        """What the scheduler says of itself in GetStats (its role, why it stopped serving while
        it runs, e.g. a fatal GPU event or its kvstore down); None when it cannot be reached
        within a second."""
        try:
            stats = await self._stub.GetStats(scheduler_stats_request_to_pb(), timeout=1)
        except grpc.aio.AioRpcError:
            return None
        return SelfReport(role_from_stats_pb(stats), not_serving_reason_from_stats_pb(stats))

    async def close(self) -> None:
        """Stops following health and closes the channel."""
        if self._health is not None:
            await self._health.close()
        await self._channel.close()


def _error_of(exc: grpc.aio.AioRpcError, address: str, carrying: bool) -> Exception:
    """What a failed Generate call raises (see :meth:`SchedulerClient.generate`). The message of
    an UNAVAILABLE the scheduler answered reaches public clients: it is made a
    :func:`public_message`, its full detail logged here."""
    if answered_by_handler(exc):
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            log.warning("scheduler %s answered UNAVAILABLE: %s", address, exc.details())
            return Unavailable(public_message("scheduler", exc.details() or ""))
        return exc
    if exc.code() in LOST_CODES:
        return SchedulerLost(f"scheduler {address}: {exc.details()}", carrying)
    return exc
