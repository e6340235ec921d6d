"""The gRPC health service, whose Watch streams end when the server stops.

grpcio-health-checking's asyncio ``HealthServicer.Watch`` never returns: it waits for the next
status change for as long as the client listens. A server stopping with such a stream open (a
frontend follows each scheduler's health with one) waits its whole grace period for it and then
cancels it, which grpc logs as an unhandled ``CancelledError`` traceback at ERROR. Here a Watch
ends normally, after its last status (NOT_SERVING), as soon as :meth:`end_watches` is called.

Source: the gRPC health checking protocol (grpc/grpc doc/health-checking.md): Watch streams the
status "whenever it changes"; the server may end the stream, and the client then reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health

FLUSH_S = 0.05
"""How long an ending Watch may still take to send its last status change (seconds)."""


class HealthServicer(health.aio.HealthServicer):
    """``grpc.health.v1.Health`` whose Watch calls end at :meth:`end_watches`."""

    def __init__(self) -> None:
        super().__init__()
        self._ending = asyncio.Event()

    async def Watch(self, request: object, context: grpc.aio.ServicerContext) -> None:
        """The library's Watch of ``request`` (a ``HealthCheckRequest``) until
        :meth:`end_watches`; then the call ends with OK."""
        watch = asyncio.ensure_future(super().Watch(request, context))
        ending = asyncio.ensure_future(self._ending.wait())
        try:
            await asyncio.wait({watch, ending}, return_when=asyncio.FIRST_COMPLETED)
            if not watch.done():
                # NOTE: lets the watch send the status set just before (NOT_SERVING).
                await asyncio.wait({watch}, timeout=FLUSH_S)
        finally:
            ending.cancel()
            if not watch.done():
                watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    def end_watches(self) -> None:
        """Ends every open Watch call (after the status it has sent last), now and from now on."""
        self._ending.set()
