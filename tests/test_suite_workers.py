"""README's test command runs the whole suite on two workers, a file to each
(tests/suite_workers.py, set by tests/conftest.py before xdist reads the options); any other
pytest runs in one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from suite_workers import run_on_workers

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


def test_readmes_command_runs_on_two_workers(tmp_path: Path) -> None:
    (tmp_path / "xdist_probe.py").write_text(PROBE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist_probe"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    printed = [line for line in done.stdout.splitlines() if line.startswith("workers:")]
    assert printed == ["workers: 2 loadfile ['popen', 'popen']"]


def config(
    source: str = "TESTPATHS", xdist: bool = True, worker: bool = False, **options: object
) -> SimpleNamespace:
    """What :func:`run_on_workers` reads of a ``pytest.Config``: by default README's command."""
    found = SimpleNamespace(
        args_source=pytest.Config.ArgsSource[source],
        pluginmanager=SimpleNamespace(hasplugin=lambda name: xdist and name == "xdist"),
        option=SimpleNamespace(
            **{"numprocesses": None, "dist": "no", "tx": [], "usepdb": False, **options}
        ),
    )
    if worker:
        found.workerinput = {"workerid": "gw0"}
    return found


@pytest.mark.parametrize(
    ("given", "workers", "dist"),
    [
        (config(), 2, "loadfile"),
        (config("ARGS"), None, "no"),  # files or node ids named
        (config("INVOCATION_DIR"), None, "no"),
        (config(numprocesses=0), 0, "no"),
        (config(numprocesses=4, dist="load"), 4, "load"),
        (config(dist="worksteal"), None, "worksteal"),
        (config(tx=["popen"]), None, "no"),
        (config(usepdb=True), None, "no"),
        (config(xdist=False), None, "no"),  # -p no:xdist
        (config(worker=True), None, "no"),
    ],
)
def test_only_the_whole_suite_goes_to_workers(
    given: SimpleNamespace, workers: int | None, dist: str
) -> None:
    run_on_workers(given)  # type: ignore[arg-type]
    assert (given.option.numprocesses, given.option.dist) == (workers, dist)
