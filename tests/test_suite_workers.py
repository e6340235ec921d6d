"""README's test command runs the whole suite on two workers (tests/conftest.py's
``pytest_cmdline_main``), a file to each; a pytest that names files runs in one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    option = config.option
    print("workers:", option.numprocesses, option.dist, option.tx, flush=True)
    pytest.exit("probed", returncode=0)
"""
"""A plugin that prints how xdist will run, once the options are final, and ends the run before
anything is collected or started."""


def test_the_whole_suite_runs_on_two_workers_and_named_files_in_one_process(
    tmp_path: Path,
) -> None:
    (tmp_path / "xdist_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    runs = {
        args: subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "xdist_probe", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for args in [(), ("tests/test_ci.py",)]
    }
    printed = {}
    for args, run in runs.items():
        out, _ = run.communicate(timeout=120)
        assert run.returncode == 0, out
        printed[args] = [line for line in out.splitlines() if line.startswith("workers:")]
    assert printed == {
        (): ["workers: 2 loadfile ['popen', 'popen']"],
        ("tests/test_ci.py",): ["workers: None no []"],
    }
