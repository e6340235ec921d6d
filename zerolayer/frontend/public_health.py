"""The frontend's own ``grpc.health.v1`` status: what it says to clients and to the launcher.

"" and the names of the public services (``zerolayer.v1.TextGeneration``,
``inference.GRPCInferenceService``) report SERVING only while the frontend serves *and* some
scheduler can take requests (the router's ``available``: one SERVING on
``zerolayer.v1.Scheduler``; a standby does not count), NOT_SERVING otherwise; so a load balancer or
client that watches them sends nothing while no request could be answered. The instance name
``zerolayer.instance.<id>`` means "this frontend process is up": the launcher finds its own
frontend by it (``zerolayer.stack.launcher``, ``wait_healthy``) and its supervisor watches it, and
neither must mistake a scheduler that is down (its own health says so) for a frontend that is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from zerolayer.common.convert import serving_status_to_pb
from zerolayer.common.server import LayerServer, instance_health_name


class FrontendServer(LayerServer):
    """A :class:`LayerServer` whose public health also needs a scheduler that takes requests."""

    def __init__(
        self,
        *args: Any,
        ready: Callable[[], bool],
        on_public_health: Callable[[bool], None] = lambda serving: None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            args, kwargs: those of :class:`LayerServer`.
            ready: True while some scheduler can take requests; call :meth:`health_changed`
                when it may have changed.
            on_public_health: called with whether the public names say SERVING each time they
                are set (e.g. the ``zerolayer_frontend_serving`` gauge's ``set``).
        """
        super().__init__(*args, **kwargs)
        self._ready = ready
        self._on_public_health = on_public_health
        self._up = False
        self._health_lock = asyncio.Lock()
        self._refreshes: set[asyncio.Task[None]] = set()

    def health_changed(self) -> None:
        """Schedules :meth:`refresh_health` on the running loop (for synchronous callers)."""
        task = asyncio.get_running_loop().create_task(self.refresh_health())
        self._refreshes.add(task)
        task.add_done_callback(self._refreshes.discard)

    async def set_serving(self, serving: bool) -> None:
        """Sets whether the frontend process serves (the instance name says so), then the public
        names (SERVING only if a scheduler can take requests too)."""
        self._up = serving
        await self.refresh_health()

    async def refresh_health(self) -> None:
        """Sets every health name from the current state (latest state wins, in order)."""
        async with self._health_lock:
            up = self._up and not self.not_serving_reason
            serving = up and self._ready()
            public = serving_status_to_pb(serving)
            for name in ["", *(b.service_name for b in self._bindings)]:
                await self.health.set(name, public)
            self._on_public_health(serving)
            if self.instance_id:
                instance = instance_health_name(self.instance_id)
                await self.health.set(instance, serving_status_to_pb(up))
