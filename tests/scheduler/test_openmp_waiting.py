"""The scheduler's OpenMP waiting: a short spin unless the user chose, set before torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zerolayer.scheduler.openmp_waiting import default_openmp_waiting


def test_a_short_spin_when_nothing_is_chosen() -> None:
    environ: dict[str, str] = {"PATH": "/bin"}
    assert default_openmp_waiting(environ) == "GOMP_SPINCOUNT=100 (default)"
    assert environ == {"PATH": "/bin", "GOMP_SPINCOUNT": "100"}


@pytest.mark.parametrize("chosen", [{"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "300000"}])
def test_the_users_choice_wins(chosen: dict[str, str]) -> None:
    environ = dict(chosen)
    ((name, value),) = chosen.items()
    assert default_openmp_waiting(environ) == f"{name}={value} (set)"
    assert environ == chosen


def probe(env: dict[str, str]) -> list[str]:
    """What the scheduler's entry module reports and leaves in the environment once it has
    imported torch (a fresh process, as the launcher starts it)."""
    code = (
        "import os, sys\n"
        "import zerolayer.scheduler.__main__ as m\n"
        "print(m.OPENMP_WAITING)\n"
        "print(os.environ.get('GOMP_SPINCOUNT'))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_the_scheduler_process_spins_briefly_by_default() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    assert probe(env) == ["GOMP_SPINCOUNT=100 (default)", "100", "True"]
    assert probe({**env, "OMP_WAIT_POLICY": "active"}) == [
        "OMP_WAIT_POLICY=active (set)",
        "None",
        "True",
    ]
