"""How many processes a pytest run uses: the whole suite two, anything else this one."""

from __future__ import annotations

import pytest

SUITE_WORKERS = 2
"""Processes the whole suite runs on (pytest-xdist; docs/development.md "Writing tests")."""


def run_on_workers(config: pytest.Config) -> None:
    """Makes the whole suite (``pytest`` naming no paths: README's command, .ci/run) run on
    :data:`SUITE_WORKERS` workers, each file's tests on one of them: ``-n 2 --dist loadfile``, set
    on ``config`` before xdist reads them (tests/conftest.py's ``pytest_cmdline_main``).

    Everything else runs in this one process as before: paths or node ids named (a test's own
    pytest, the device check's, a developer's few files: two workers only add their start-up),
    ``-n``, ``--dist`` or ``--tx`` given (``-n 0``: serial), ``-p no:xdist``, ``--pdb``, and the
    workers themselves.
    """
    option = config.option
    if (
        config.args_source is not pytest.Config.ArgsSource.TESTPATHS
        or not config.pluginmanager.hasplugin("xdist")
        or hasattr(config, "workerinput")
        or option.numprocesses is not None
        or option.dist != "no"
        or option.tx
        or option.usepdb
    ):
        return
    option.numprocesses = SUITE_WORKERS
    option.dist = "loadfile"
