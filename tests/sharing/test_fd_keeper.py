"""Tests for the launcher's descriptor keeper, with a memfd standing in for a CUDA VMM allocation
(the same lifetime rule: memory lives while any process holds a descriptor or a mapping)."""

from __future__ import annotations

import mmap
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from zerolayer.sharing.fd_keeper import FdKeeper, fetch_kept_fd, keep_fd

DEPOSIT = """
import os, sys
from zerolayer.sharing.fd_keeper import keep_fd
fd = os.memfd_create("weights")
os.write(fd, b"weights v1" + bytes(4086))
keep_fd(sys.argv[1], "weights-abc-GPU-1", fd, {"size_bytes": 4096})
"""


def run_python(code: str, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    subprocess.run([sys.executable, "-c", code, *args], check=True, env=env, timeout=60)


@pytest.fixture
def keeper(tmp_path: Path):  # noqa: ANN201
    k = FdKeeper(tmp_path / "fds.sock")
    yield k
    k.close()


def test_a_deposit_outlives_the_depositing_process(keeper: FdKeeper) -> None:
    run_python(DEPOSIT, keeper.path)  # the "loader" exits right after depositing
    kept = fetch_kept_fd(keeper.path, "weights-abc-GPU-1")
    assert kept is not None
    fd, meta = kept
    try:
        assert meta == {"size_bytes": 4096}
        with mmap.mmap(fd, 4096) as m:
            assert m[:10] == b"weights v1"
            m[:10] = b"weights v2"  # the same memory, not a copy: a second fetch sees it
        fd2, _ = fetch_kept_fd(keeper.path, "weights-abc-GPU-1")  # type: ignore[misc]
        with mmap.mmap(fd2, 4096) as m:
            assert m[:10] == b"weights v2"
        os.close(fd2)
    finally:
        os.close(fd)
    assert keeper.keys == ["weights-abc-GPU-1"]


def test_unknown_key_is_none_and_a_new_deposit_replaces_the_old(keeper: FdKeeper) -> None:
    assert fetch_kept_fd(keeper.path, "nothing") is None
    a, b = os.memfd_create("a"), os.memfd_create("b")
    os.write(a, b"A")
    os.write(b, b"B")
    keep_fd(keeper.path, "k", a, {"v": 1})
    keep_fd(keeper.path, "k", b, {"v": 2})
    os.close(a)
    os.close(b)
    fd, meta = fetch_kept_fd(keeper.path, "k")  # type: ignore[misc]
    assert meta == {"v": 2} and os.pread(fd, 1, 0) == b"B"
    os.close(fd)


def test_keys_with_spaces_are_refused() -> None:
    with pytest.raises(ValueError, match="key"):
        keep_fd("/nonexistent", "a b", 0, {})


def test_socket_is_private_and_close_releases_everything(tmp_path: Path) -> None:
    keeper = FdKeeper(tmp_path / "fds.sock")
    assert stat.S_IMODE(os.stat(keeper.path).st_mode) == 0o600
    fd = os.memfd_create("x")
    keep_fd(keeper.path, "x", fd, {})
    os.close(fd)
    num_fds = len(os.listdir("/proc/self/fd"))
    keeper.close()
    keeper.close()
    assert not os.path.exists(keeper.path)
    assert len(os.listdir("/proc/self/fd")) < num_fds  # the kept descriptor was closed
    with pytest.raises(OSError):
        fetch_kept_fd(keeper.path, "x")
