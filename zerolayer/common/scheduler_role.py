"""A scheduler's role in a stack with several: the domain form of ``zerolayer.v1.SchedulerRole``."""

from __future__ import annotations

import enum


class SchedulerRole(enum.IntEnum):
    """Whether a scheduler takes traffic (mirrors zerolayer.v1.SchedulerRole). The role only
    changes what its health reports on ``zerolayer.v1.Scheduler``; calls it gets are served
    either way."""

    UNSPECIFIED = 0
    ACTIVE = 1
    """Health SERVING on "" and on ``zerolayer.v1.Scheduler`` once warmed."""
    STANDBY = 2
    """Health SERVING on "" once warmed, NOT_SERVING on ``zerolayer.v1.Scheduler`` until
    activated."""
