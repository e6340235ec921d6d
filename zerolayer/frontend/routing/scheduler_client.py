"""The frontend's asynchronous client of one scheduler: its Generate stream, its block size, and
its health, which it follows for the router (:mod:`zerolayer.frontend.routing.health_client`)."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import nullcontext
from dataclasses import dataclass

import grpc

from zerolayer.common.convert import (
    abort_sample_request_to_pb,
    block_size_from_stats_pb,
    engine_request_to_pb,
    not_serving_reason_from_stats_pb,
    request_output_from_pb,
    role_from_stats_pb,
    scheduler_stats_request_to_pb,
)
from zerolayer.common.errors import InvalidArgument, SchedulerLost, Unavailable
from zerolayer.common.generation import EngineRequest, RequestOutput
from zerolayer.common.scheduler_role import SchedulerRole
from zerolayer.common.server import FAST_RECONNECT_CHANNEL_OPTIONS
from zerolayer.common.status import answered_by_handler
from zerolayer.common.tracing import Tracing
from zerolayer.frontend.routing.health_client import HealthWatcher
from zerolayer.frontend.routing.public_errors import public_message
from zerolayer.frontend.routing.router import Router
from zerolayer.v1 import scheduler_pb2_grpc

log = logging.getLogger(__name__)

LOST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
"""Codes of a call whose scheduler went away, when no handler chose them: unreachable, the
connection broke (UNAVAILABLE), or the server cancelled the call as it shut down (CANCELLED)."""


PING_INTERVAL_S = 1.0
"""How often the frontend pings each scheduler connection, with or without calls, seconds (the
servers accept pings every ``MIN_CLIENT_PING_INTERVAL_MS`` or slower)."""


def scheduler_channel_options(hung_after_s: float) -> tuple[tuple[str, int], ...]:
    """Options of the frontend's channel to each scheduler: fast reconnects plus keepalive.

    Args:
        hung_after_s: how long an unanswered ping may stay unanswered before the connection is
            closed and the scheduler counts as hung (``--scheduler-hung-after-s``), seconds.
    """
    return (
        # NOTE: a scheduler that starts, or restarts, is routed to within 100 ms of listening
        *FAST_RECONNECT_CHANNEL_OPTIONS,
        # NOTE: a hung scheduler keeps its connection open and its health stream just goes
        # quiet, so without pings the router kept routing to it and the public health stayed
        # SERVING while every Generate timed out. HTTP/2 pings are answered by gRPC's core
        # threads, not the Python loop, so a busy engine still answers them; an unanswered one
        # closes the connection, which ends the health streams (the router takes the scheduler
        # out) and the calls on it (their requests fail over as when the scheduler dies). Spec:
        # gRPC A8 client-side keepalive,
        # https://github.com/grpc/proposal/blob/master/A8-client-side-keepalive.md
        ("grpc.keepalive_time_ms", int(PING_INTERVAL_S * 1000)),
        ("grpc.keepalive_timeout_ms", int(hung_after_s * 1000)),
        # NOTE: in this gRPC (1.85) an unanswered keepalive ping ends the connection only after
        # the ping timeout (default 1 min), whatever keepalive_timeout_ms says.
        ("grpc.http2.ping_timeout_ms", int(hung_after_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_time_between_pings_ms", int(PING_INTERVAL_S * 1000)),
    )


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

    def __init__(
        self,
        address: str,
        *,
        hung_after_s: float,
        tracing: Tracing | None = None,
    ) -> None:
        """
        Args:
            address: the scheduler's gRPC address.
            tracing: a CLIENT span around each call, its context sent in the call's metadata.
            hung_after_s: seconds an unanswered keepalive ping takes to close the connection
                (``--scheduler-hung-after-s``).
        """
        self.address = address
        self._tracing = tracing
        options = scheduler_channel_options(hung_after_s)
        self._channel = grpc.aio.insecure_channel(address, options=options)
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

    async def abort_sample(self, request_id: str, index: int, timeout_s: float = 5.0) -> None:
        """Asks the scheduler to end sample ``index`` of the request in flight as ``request_id``
        (its stream then gets the sample's ABORT output). Best effort: a failed call only leaves
        the sample running to its end, and is logged."""
        try:
            await self._stub.AbortSample(
                abort_sample_request_to_pb(request_id, index), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            log.info("scheduler %s: AbortSample failed: %s", self.address, exc.code().name)

    async def block_size(self, timeout_s: float = 5.0) -> int:
        """The KV block size the scheduler runs with (0 if it does not answer within
        ``timeout_s`` seconds)."""
        try:
            stats = await self._stub.GetStats(scheduler_stats_request_to_pb(), timeout=timeout_s)
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


_NAMED_FIELD = re.compile(r"(?P<field>[a-z_][a-z0-9_.]*(?:\[\d+\])?): (?P<reason>.*)", re.DOTALL)
"""An InvalidArgument's message: the field (``structured_output.grammar``), then why."""


def _error_of(exc: grpc.aio.AioRpcError, address: str, carrying: bool) -> Exception:
    """What a failed Generate call raises (see :meth:`SchedulerClient.generate`). The message of
    an UNAVAILABLE the scheduler answered reaches public clients: it is made a
    :func:`public_message`, its full detail logged here."""
    if answered_by_handler(exc):
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            log.warning("scheduler %s answered UNAVAILABLE: %s", address, exc.details())
            return Unavailable(public_message("scheduler", exc.details() or ""))
        named = _NAMED_FIELD.match(exc.details() or "")
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and named:
            # NOTE: the field named again, for the public APIs that say it apart (OpenAI's param)
            return InvalidArgument(named["field"], named["reason"])
        return exc
    if exc.code() in LOST_CODES:
        return SchedulerLost(f"scheduler {address}: {exc.details()}", carrying)
    return exc
