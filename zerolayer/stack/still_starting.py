"""What the launcher can tell about a layer that is still starting when the start-up deadline
passes: one line naming it and why, as far as can be seen from outside (its health answer, how
much CPU it has used, its last log line)."""

from __future__ import annotations

import os
from pathlib import Path

from zerolayer.common.stack_settings import STARTUP_TIMEOUT_S


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of process ``pid`` so far, seconds (Linux ``/proc``); None when
    it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def last_log_line(path: Path | None) -> str:
    """The last non-empty line of the log file at ``path`` ("" without one)."""
    if path is None or not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        lines = f.read().decode(errors="replace").splitlines()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def still_starting(
    name: str, pid: int, health: str | None, timeout_s: float, log_path: Path | None
) -> str:
    """``scheduler still starting after --startup-timeout-s 180 (pid 42, 3.1 s of CPU, health:
    not answering yet); its last log line: ...``.

    Args:
        name: the process (``scheduler``, ``frontend-1``).
        pid: its process id.
        health: the name of its last ``grpc.health.v1`` status (``NOT_SERVING``); None when it
            did not answer.
        timeout_s: the deadline it missed, seconds.
        log_path: its log file (``--log-dir``); None when its stderr is this process's.
    """
    if health is None:
        state = "health: not answering yet"
    else:
        state = f"health: {health}"
    cpu = cpu_seconds(pid)
    used = "" if cpu is None else f", {cpu:.1f} s of CPU"
    line = f"{name} still starting after {STARTUP_TIMEOUT_S.flag} {timeout_s:g} (pid {pid}{used}, "
    line += f"{state})"
    if last := last_log_line(log_path):
        line += f"; its last log line: {last}"
    return line
