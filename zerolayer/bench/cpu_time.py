"""CPU time of processes, to say where the cycles of a run went (Linux ``/proc``).

Source: proc(5), ``/proc/<pid>/stat`` fields 14 (utime) and 15 (stime), in clock ticks.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from pathlib import Path


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of all threads of ``pid`` so far.

    Raises:
        FileNotFoundError: no process ``pid``.
    """
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """User + system CPU seconds of this process (every thread) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """CPU seconds that named processes and this one spend between construction and ``read``."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self._pids = dict(pids)
        self._start = {name: process_cpu_s(pid) for name, pid in self._pids.items()}
        self._own_start = own_cpu_s()

    def read(self) -> dict[str, float]:
        """CPU seconds per name since construction, and ``client`` for this process."""
        out = {name: process_cpu_s(pid) - self._start[name] for name, pid in self._pids.items()}
        out["client"] = own_cpu_s() - self._own_start
        return out
