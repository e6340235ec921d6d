"""A scripted GPU for tests: events and samples from a JSON-lines file instead of NVML.

The scheduler runs with it when started with the hidden flag ``--nvml-script PATH`` (tests only),
so an end-to-end test drives the real event thread, poller and health path without a GPU. The file
is tailed: lines can be written before the scheduler starts or appended while it runs. Each line
is one JSON object:

- an event: ``{"event": "xid", "data": 79}``; ``event`` is an :class:`EventKind` value
  (``xid``, ``single_bit_ecc``, ``double_bit_ecc``, ``pstate``, ``gpu_unavailable``,
  ``recovery_action``, ``gpu_lost``), ``data`` as in :class:`GpuEvent` (default 0). An optional
  ``"at_s": 2.5`` holds it back until that many seconds after the source opened.
- a sample: ``{"sample": {"sm_utilization_percent": 90, "memory_used_bytes": 1048576,
  "clock_event_reasons": 64}}``; every poll returns the latest sample line (zeros before one).

A line that does not parse is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from zerolayer.scheduler.gpu_health.events import EventKind, GpuEvent
from zerolayer.scheduler.gpu_health.monitor import GpuSample

log = logging.getLogger(__name__)

POLL_S = 0.01
"""How often :meth:`ScriptedGpu.wait` looks at the file while it waits."""


class ScriptedGpu:
    """Both an ``EventSource`` and a ``SampleSource``, read from a JSON-lines file; thread-safe
    (the event thread and the poller share it)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._clock = clock
        self._opened = clock()
        self._offset = 0
        self._pending: list[tuple[float, GpuEvent]] = []
        """(due time, event) in file order."""
        self._sample = GpuSample(0.0, 0, 0)
        self._lock = threading.Lock()

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        """The next due event, looking at the file every 10 ms for up to ``timeout_ms``."""
        deadline = self._clock() + timeout_ms / 1000
        while True:
            with self._lock:
                self._read()
                now = self._clock()
                for index, (due, event) in enumerate(self._pending):
                    if due <= now:
                        del self._pending[index]
                        return event
            remaining = deadline - now
            if remaining <= 0:
                return None
            time.sleep(min(POLL_S, remaining))

    def sample(self) -> GpuSample:
        """The latest scripted sample."""
        with self._lock:
            self._read()
            return self._sample

    def close(self) -> None:
        """Nothing to release."""

    def _read(self) -> None:
        """Parses the complete lines appended since the last read."""
        try:
            with self._path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            if line.strip():
                self._parse(line)

    def _parse(self, line: str) -> None:
        try:
            item = json.loads(line)
            if "sample" in item:
                s = item["sample"]
                self._sample = GpuSample(
                    float(s.get("sm_utilization_percent", 0.0)),
                    int(s.get("memory_used_bytes", 0)),
                    int(s.get("clock_event_reasons", 0)),
                )
                return
            event = GpuEvent(EventKind(item["event"]), int(item.get("data", 0)))
            due = self._opened + float(item.get("at_s", 0.0))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error(
                "%s: skipping a line that is not an event or a sample (%s): %r",
                self._path,
                exc,
                line,
            )
            return
        self._pending.append((due, event))
