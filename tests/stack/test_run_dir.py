"""The temporary run directories of ``zerolayer up`` (zerolayer/stack/run_dir.py): a new one is
named after its ``up``, and those of an ``up`` that is gone are removed by the next one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from zerolayer.stack.run_dir import OWNED_RUN_DIR, new_run_dir, remove_stale_run_dirs


def dead_pid() -> int:
    """The pid of a process that has exited."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def run_dir(parent: Path, pid: int, *sockets: str) -> Path:
    """A run directory of the ``up`` with ``pid``, holding unix sockets named ``sockets``."""
    path = parent / f"zerolayer-{pid}-abc_123"
    path.mkdir(mode=0o700)
    for name in sockets:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path / name))
    return path


def test_a_new_run_dir_names_its_up_and_is_private(tmp_path: Path) -> None:
    path = new_run_dir(tmp_path)
    assert OWNED_RUN_DIR.fullmatch(path.name)[1] == str(os.getpid())
    assert path.stat().st_mode & 0o777 == 0o700


def test_only_the_run_dirs_of_an_up_that_is_gone_are_removed(short_dir: Path) -> None:
    tmp_path = short_dir
    gone = dead_pid()
    empty = run_dir(tmp_path, gone)
    with_sockets = run_dir(tmp_path, gone + 100_000_000, "loader.sock", "kvstore.sock")
    alive = run_dir(tmp_path, os.getpid(), "loader.sock")
    assert sorted(remove_stale_run_dirs(tmp_path)) == sorted([empty, with_sockets])
    assert not empty.exists() and not with_sockets.exists() and alive.exists()


def test_what_is_not_clearly_a_dead_up_s_is_left_alone(tmp_path: Path) -> None:
    gone = dead_pid()
    holds_a_file = run_dir(tmp_path, gone)
    (holds_a_file / "notes.txt").write_text("mine")
    shared = tmp_path / f"zerolayer-{gone}-shared_1"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    other_name = tmp_path / f"zerolayer-device-check-work.{gone}"
    other_name.mkdir(mode=0o700)
    link = tmp_path / f"zerolayer-{gone}-link_1"
    link.symlink_to(other_name)
    assert remove_stale_run_dirs(tmp_path) == []
    assert all(p.exists() for p in (holds_a_file, shared, other_name, link))
