"""What the device check's bench leaves behind however it ends: a time budget every deadline is
taken from, and a report document rewritten after every phase.

:class:`Report` replaces its file atomically (``os.replace`` of a sibling), so a reader, or what
the device tool brings back after the step's ``timeout`` killed the run, never sees half a
document: it holds every phase that finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator


class BudgetExhausted(Exception):
    """The run's time is up before a phase could run or finish."""


class Interrupted(Exception):
    """SIGTERM arrived."""


@contextlib.contextmanager
def sigterm_held() -> Iterator[None]:
    """Holds SIGTERM back inside the block, then hands one that arrived to the handler it had
    replaced (the bench's raises :class:`Interrupted`), unless the block raised.

    The stack stops inside one: the step's ``timeout`` signals the run's whole process group, and
    an :class:`Interrupted` raised inside the stop cut it short (its run directory was left).
    """
    arrived: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
    if arrived and callable(previous):
        previous(signal.SIGTERM, None)


class Budget:
    """What is left of ``seconds`` from now."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self, phase: str) -> float:
        """Seconds left, for a deadline in ``phase``.

        Raises:
            BudgetExhausted: none left (the message names ``phase``).
        """
        seconds = self.deadline - time.monotonic()
        if seconds <= 0:
            raise BudgetExhausted(f"the budget ran out in phase {phase}")
        return seconds


class Report:
    """The report document, written to ``path`` (when set) after every phase."""

    def __init__(self, path: str, doc: dict) -> None:
        self.path = path
        self.doc = {**doc, "phases_done": [], "problems": []}
        self.phase_now = "start"
        """The phase running (for the interruption message)."""

    def phase(self, name: str, value: dict) -> None:
        """Records phase ``name``'s figures and writes the report."""
        self.doc[name] = value
        self.doc["phases_done"].append(name)
        self.write()

    def problem(self, text: str) -> None:
        self.doc["problems"].append(text)

    def write(self) -> None:
        """Replaces the file at ``path`` atomically (a reader never sees half a document)."""
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=2, default=str)
        os.replace(tmp, self.path)
