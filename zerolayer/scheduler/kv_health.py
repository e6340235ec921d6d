"""Whether the kvstore this scheduler depends on can serve it, for the scheduler's own readiness.

A request that needs KV blocks waits for an unusable kvstore (down, restarting) for up to
``kv_unavailable_timeout_s``, then ends with UNAVAILABLE; once the kvstore has been unusable that
long, every new request ends so at its first step. From that moment until the kvstore answers
again, the scheduler reports NOT_SERVING on ``zerolayer.v1.Scheduler`` (not on "": the process
itself is fine, and a supervisor must not restart it for its kvstore's outage), so routers and the
frontend's public health stop counting on it, and its stats carry why.

The kvstore is asked through its ``grpc.health.v1`` "" status (SERVING once it recovered its
arena), polled every :data:`POLL_INTERVAL_S` on the scheduler's event loop: a scheduler that serves
no request makes no kvstore call of its own that would notice the outage.
Spec: https://github.com/grpc/grpc/blob/master/doc/health-checking.md
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2_grpc

from zerolayer.common.convert import health_request_to_pb, serving_from_health_pb

POLL_INTERVAL_S = 0.25
"""Seconds between two health checks of the kvstore; also each check's deadline."""


class KVStoreReadiness:
    """Follows the kvstore's health and reports, through ``on_change``, a reason the scheduler
    cannot serve ("" once it can again)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        timeout_s: float,
        on_change: Callable[[str], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            channel: to the kvstore (aio, on the running loop).
            timeout_s: how long the kvstore may be unusable before requests fail, seconds (the
                scheduler's ``kv_unavailable_timeout_s``).
            on_change: awaited with the reason when the scheduler becomes unable to serve for
                its kvstore, and with "" when it can serve again.
            clock: seconds, monotonic (tests inject one).
        """
        self._stub = health_pb2_grpc.HealthStub(channel)
        self._timeout_s = timeout_s
        self._on_change = on_change
        self._clock = clock
        self._unusable_since: float | None = None
        self.reason = ""
        """Why the scheduler cannot serve because of its kvstore; "" while it can."""

    async def check(self) -> None:
        """Asks the kvstore once and reports a change of :attr:`reason`. Never raises (an
        unanswered or failed check is the kvstore being unusable)."""
        try:
            response = await self._stub.Check(health_request_to_pb(""), timeout=POLL_INTERVAL_S)
            serving = serving_from_health_pb(response)
        except grpc.aio.AioRpcError:
            serving = False
        now = self._clock()
        if serving:
            self._unusable_since = None
        elif self._unusable_since is None:
            self._unusable_since = now
        reason = ""
        if self._unusable_since is not None and now - self._unusable_since >= self._timeout_s:
            reason = (
                f"kvstore: unusable for more than {self._timeout_s:g} s; requests that need "
                "KV blocks fail until it is back"
            )
        if reason != self.reason:
            self.reason = reason
            await self._on_change(reason)

    async def follow(self) -> None:
        """Checks every :data:`POLL_INTERVAL_S` until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(POLL_INTERVAL_S)
