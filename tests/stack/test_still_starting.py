"""The launcher's account of a layer still starting at the start-up deadline
(zerolayer/stack/still_starting.py), read from a real process and a real log file."""

from __future__ import annotations

import os
import re
from pathlib import Path

from grpc_health.v1 import health_pb2

from zerolayer.stack.probes import status_name
from zerolayer.stack.still_starting import still_starting


def test_it_names_the_process_its_cpu_its_health_and_its_last_log_line(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    log.write_text("scheduler INFO starting\nscheduler INFO loading the model\n\n")
    not_serving = status_name(health_pb2.HealthCheckResponse.NOT_SERVING)
    line = still_starting("scheduler", os.getpid(), not_serving, 180.0, log)
    assert re.fullmatch(
        rf"scheduler still starting after --startup-timeout-s 180 \(pid {os.getpid()}, "
        r"\d+\.\d s of CPU, health: NOT_SERVING\); its last log line: scheduler INFO loading "
        r"the model",
        line,
    ), line


def test_without_a_log_or_a_process_it_says_what_it_knows(tmp_path: Path) -> None:
    gone = 2**22 + 1  # above Linux's largest pid
    assert still_starting("loader", gone, None, 0.5, tmp_path / "missing.log") == (
        f"loader still starting after --startup-timeout-s 0.5 (pid {gone}, health: not "
        "answering yet)"
    )
