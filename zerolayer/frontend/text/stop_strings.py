"""Stop-string matching over streamed text pieces."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Finds the first stop string in streamed text and holds back text that could still become one.

    Which stop wins: the one whose occurrence is completed first in the stream (smallest end
    position in the text); among stops completed by the same character, the one that starts
    earliest. This is the moment a server sees a stop string appear and finishes the request, and
    it does not depend on how the text is split into feeds. Example: stops ``["bc", "abcd"]`` on
    ``"abcd"`` stop at ``"bc"`` and emit ``"a"``.

    Text that is emitted never contains (the start of) the matched stop string; only the longest
    suffix of the pending text that is a prefix of some stop string is held back. Empty stop
    strings are ignored.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        """``stop``: the stop strings; empty (or only empty strings) means never stop."""
        self._stops = tuple(dict.fromkeys(s for s in stop if s))
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""
        self._matched = ""

    @property
    def matched(self) -> bool:
        """True once a stop string has been found."""
        return bool(self._matched)

    @property
    def matched_stop(self) -> str:
        """The stop string found ("" while none is)."""
        return self._matched

    def feed(self, text: str) -> tuple[str, bool]:
        """Append ``text``; return (text safe to emit now, whether a stop string was found).

        On a match the emitted text ends right before the stop string and everything after its
        start is dropped.

        Raises:
            RuntimeError: called again after a match.
        """
        if self._matched:
            raise RuntimeError("StopStringMatcher.feed called after a stop string matched")
        pending = self._pending + text
        found = self._first_stop(pending)
        if found is not None:
            stop_start, self._matched = found
            self._pending = ""
            return pending[:stop_start], True
        num_held = self._num_held(pending)
        self._pending = pending[len(pending) - num_held :]
        return pending[: len(pending) - num_held], False

    def flush(self) -> str:
        """At the end of generation: return the held-back tail ("" after a match); resets it."""
        tail, self._pending = self._pending, ""
        return tail

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        """Start and stop string of the stop occurrence that ends first in ``text`` (ties:
        earliest start)."""
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            start = text.find(stop)
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                if best is None or candidate < best:
                    best = candidate
        return None if best is None else (best[1], best[2])

    def _num_held(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
        for length in range(min(len(text), self._max_hold), 0, -1):
            suffix = text[-length:]
            if any(stop.startswith(suffix) for stop in self._stops):
                return length
        return 0
