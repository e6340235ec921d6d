"""CPU accounting of zerolayer.bench.cpu_time against processes that burn a known amount of CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zerolayer.bench.cpu_time import CpuMeter, own_cpu_s, process_cpu_s

# Waits for a line on stdin, burns 0.5 CPU seconds, says "done", waits for stdin to close.
BURNER = """
import sys, time
sys.stdin.readline()
end = time.process_time() + 0.5
while time.process_time() < end:
    pass
print("done", flush=True)
sys.stdin.read()
"""


def start(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_a_child_burning_half_a_second_is_measured_and_an_idle_one_is_not() -> None:
    burner, sleeper = start(BURNER), start("import sys; sys.stdin.read()")
    try:
        meter = CpuMeter({"burner": burner.pid, "sleeper": sleeper.pid})
        burner.stdin.write("go\n")
        burner.stdin.flush()
        end = own_cpu_s() + 0.2
        while own_cpu_s() < end:
            pass
        assert burner.stdout.readline() == "done\n"
        used = meter.read()
    finally:
        for p in (burner, sleeper):
            p.stdin.close()
            p.wait(timeout=10)
    assert set(used) == {"burner", "sleeper", "client"}
    assert 0.45 <= used["burner"] < 1.5
    assert used["sleeper"] < 0.1
    assert used["client"] >= 0.2


def test_a_missing_process_raises() -> None:
    process = subprocess.Popen(["true"])
    process.wait()
    with pytest.raises(FileNotFoundError):
        process_cpu_s(process.pid)
    assert process_cpu_s(os.getpid()) > 0
