"""The scheduler's role in a stack with several: active, or a warmed standby until activated.

A standby is a whole scheduler (weights mapped, arena mapped, warmed) that only tells the
frontends not to send it work: its health reports NOT_SERVING on ``zerolayer.v1.Scheduler``
while reporting SERVING on "" (alive and warmed). Activating it releases that service's health;
nothing else changes, so the promotion costs one RPC instead of a scheduler's start-up. Calls a
standby gets anyway (a frontend with no active scheduler left) are served.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from zerolayer.common.scheduler_role import SchedulerRole

log = logging.getLogger(__name__)


class RoleSwitch:
    """A scheduler's role: standby until :meth:`activate`, then active for good."""

    def __init__(
        self,
        standby: bool,
        release: Callable[[], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            standby: start as a standby (``--standby``); False: active from the start.
            release: makes the scheduler's service report the server's health (called once,
                by the activation).
            clock: monotonic seconds (tests inject one).
        """
        self._role = SchedulerRole.STANDBY if standby else SchedulerRole.ACTIVE
        self._release = release
        self._clock = clock
        self._since = clock()

    @property
    def role(self) -> SchedulerRole:
        """The current role."""
        return self._role

    async def activate(self) -> SchedulerRole:
        """Makes a standby active (its service reports SERVING once the scheduler serves); an
        active scheduler stays as it is.

        Returns:
            The role before the call.
        """
        previous = self._role
        if previous is SchedulerRole.STANDBY:
            self._role = SchedulerRole.ACTIVE
            await self._release()
            log.info("activated after %.1f s as a standby", self._clock() - self._since)
        return previous
