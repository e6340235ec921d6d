"""The pins' clock under ``--testing-pin-clock``: the kvstore's monotonic clock plus an offset
that a test moves forward (AdvancePinClock), so that a pin's expiry at its ttl can be tested
without waiting for it. Only the pins' deadlines read it: owners' leases and the recovery window
of a restart keep the kvstore's own clock."""

from __future__ import annotations

import math
from collections.abc import Callable

from zerolayer.common.errors import InvalidArgument

NOT_TESTING = "AdvancePinClock: the kvstore was not started with --testing-pin-clock"
"""The refusal of a clock advance on a kvstore whose pins keep the real clock."""


class OffsetClock:
    """``base() + offset_s``, seconds; the offset only grows (:meth:`advance`), so the clock
    stays monotonic."""

    def __init__(self, base: Callable[[], float]) -> None:
        """
        Args:
            base: seconds, monotonic (the kvstore's clock).
        """
        self.base = base
        self.offset_s = 0.0
        """How far the clock has been moved ahead of ``base``, seconds."""

    def __call__(self) -> float:
        return self.base() + self.offset_s

    def advance(self, advance_s: float) -> None:
        """Moves the clock ``advance_s`` seconds forward.

        Raises:
            InvalidArgument: ``advance_s`` is not a finite number >= 0.
        """
        if not (math.isfinite(advance_s) and advance_s >= 0):
            raise InvalidArgument(
                "advance_s", f"{advance_s} is not a finite number of seconds >= 0"
            )
        self.offset_s += advance_s
