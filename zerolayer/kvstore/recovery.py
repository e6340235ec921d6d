"""The restart rule: when a restarted kvstore may hand out blocks again.

A kvstore that reopened an existing arena does not know which blocks its owners (the schedulers)
hold: they declare it by reconciling. It hands out no block nobody declared until both

1. a recovery window, one lease length, has passed since its start, and
2. every owner that registered since its start (or, for the default owner, called) has reconciled
   or lost its lease.

Assumption: every live owner reconciles within one lease of the restart. A scheduler notices the
restart at its next call or keep-alive (a third of a lease apart) and reconciles at once; one
that was stopped longer than a lease has lost its lease anyway. Meanwhile owners that reconciled
may free, look up and commit: hits only take references on full blocks, which nobody writes. A
kvstore that created a new arena needs no recovery: nobody can hold a block of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from zerolayer.kvstore.owners import Owner, owner_name
from zerolayer.kvstore.refusals import Recovering


class Recovery:
    """Whether the kvstore is still recovering; once over, it stays over."""

    def __init__(
        self, needed: bool, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """
        Args:
            needed: the kvstore reopened an existing arena (False: it is over from the start).
            window_s: the recovery window, seconds (the lease length).
            clock: seconds, monotonic; the window starts at the first reading.
        """
        self.clock = clock
        self.window_s = window_s
        self.started_at = clock()
        self._over = not needed

    def remaining_s(self) -> float:
        """What is left of the recovery window, seconds (0 once it passed or recovery is over)."""
        if self._over:
            return 0.0
        return max(0.0, self.started_at + self.window_s - self.clock())

    def is_over(self, owners: Iterable[Owner]) -> bool:
        """True once the window passed and none of ``owners`` (every owner known since start)
        still has to reconcile; latches."""
        if not self._over and not self.remaining_s() and not _unreconciled(owners):
            self._over = True
        return self._over

    def check(self, owners: Iterable[Owner]) -> None:
        """Raises if blocks may not be handed out yet.

        Raises:
            Recovering: still recovering; the message says what it waits for.
        """
        owners = list(owners)
        if self.is_over(owners):
            return
        waiting = ", ".join(owner_name(o.owner_id) for o in _unreconciled(owners)) or "none"
        raise Recovering(
            "kvstore: recovering after a restart: no block is handed out before every owner "
            f"has reconciled (still waiting for: {waiting}) and the {self.window_s:g} s recovery "
            f"window has passed ({self.remaining_s():.1f} s left)"
        )


def _unreconciled(owners: Iterable[Owner]) -> list[Owner]:
    return [o for o in owners if not o.reconciled and not o.lease_expired]
