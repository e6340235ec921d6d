"""Tests for fd_passing: descriptors handed over a unix socket outlive the process that served them.

A memfd stands in for a CUDA VMM allocation: both are kernel objects that live while any process
holds a descriptor for them, which is the property the VMM export path relies on.
"""

from __future__ import annotations

import mmap
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from zerolayer.common.errors import NotFound, Unavailable
from zerolayer.sharing.fd_passing import FdServer, receive_fd

REPO_ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = bytes(range(256)) * 16  # 4096 bytes: one page

EXPORTER = """
import os, sys
from zerolayer.sharing.fd_passing import FdServer

fd = os.memfd_create("zerolayer-test")
os.write(fd, bytes(range(256)) * 16)
server = FdServer(sys.argv[1])
server.register("weights", fd)
os.close(fd)  # the server's duplicate is now the only reference in this process
print("ready", flush=True)
sys.stdin.readline()
server.close()
"""


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for sockets (AF_UNIX paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="zl-fd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_memfd(data: bytes) -> int:
    fd = os.memfd_create("zerolayer-test")
    os.write(fd, data)
    return fd


def start_exporter(path: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(EXPORTER), str(path)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()
    assert line == "ready\n", child.stderr.read()
    return child


def test_memfd_from_another_process_outlives_it(sock_dir: Path) -> None:
    path = sock_dir / "loader.sock"
    child = start_exporter(path)
    try:
        fd = receive_fd(path, "weights")
        with mmap.mmap(fd, len(PAYLOAD)) as mapped:
            assert mapped[:] == PAYLOAD
    finally:
        child.stdin.write("exit\n")
        child.stdin.close()
        child.wait(timeout=30)
    assert child.returncode == 0, child.stderr.read()
    assert not path.exists()  # the exporter's close() removed its socket
    try:
        # Only this descriptor refers to the memfd now.
        with mmap.mmap(fd, len(PAYLOAD)) as mapped:
            assert mapped[:] == PAYLOAD
            mapped[:4] = b"\xde\xad\xbe\xef"
        assert os.pread(fd, 8, 0) == b"\xde\xad\xbe\xef" + PAYLOAD[4:8]
        os.pwrite(fd, b"\x00\x01", 4094)
        with mmap.mmap(fd, len(PAYLOAD)) as mapped:
            assert mapped[4090:] == PAYLOAD[4090:4094] + b"\x00\x01"
    finally:
        os.close(fd)


def test_received_fd_is_the_same_file_and_not_inheritable(sock_dir: Path) -> None:
    fd = make_memfd(b"abc")
    with FdServer(sock_dir / "s.sock") as server:
        server.register("kv", fd)
        received = receive_fd(server.path, "kv")
    try:
        assert received != fd
        assert os.fstat(received).st_ino == os.fstat(fd).st_ino
        assert os.get_inheritable(received) is False
        os.pwrite(received, b"xyz", 0)
        assert os.pread(fd, 3, 0) == b"xyz"  # one open file, two descriptors
    finally:
        os.close(received)
        os.close(fd)


def test_register_keeps_its_own_duplicate(sock_dir: Path) -> None:
    fd = make_memfd(b"hello")
    with FdServer(sock_dir / "s.sock") as server:
        server.register("weights", fd)
        os.close(fd)
        received = receive_fd(server.path, "weights")
        assert os.pread(received, 5, 0) == b"hello"
        os.close(received)


def test_unknown_handle_id_is_not_found(sock_dir: Path) -> None:
    fd = make_memfd(b"x")
    with FdServer(sock_dir / "s.sock") as server:
        server.register("weights", fd)
        os.close(fd)
        with pytest.raises(NotFound, match="handle_id: 'kv-arena' is not served"):
            receive_fd(server.path, "kv-arena")


def test_unregistered_handle_id_is_not_found(sock_dir: Path) -> None:
    fd = make_memfd(b"x")
    with FdServer(sock_dir / "s.sock") as server:
        server.register("weights", fd)
        server.unregister("weights")
        with pytest.raises(NotFound, match="'weights'"):
            receive_fd(server.path, "weights")
        with pytest.raises(NotFound, match="'weights' is not registered"):
            server.unregister("weights")
    os.close(fd)


def test_no_server_is_unavailable(sock_dir: Path) -> None:
    with pytest.raises(Unavailable, match="fd_socket: cannot fetch 'weights'"):
        receive_fd(sock_dir / "missing.sock", "weights", timeout_s=1.0)


def test_socket_file_without_a_server_is_unavailable(sock_dir: Path) -> None:
    path = sock_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))
    with pytest.raises(Unavailable, match="fd_socket: cannot fetch"):
        receive_fd(path, "weights", timeout_s=1.0)


def test_socket_is_0600_and_removed_on_close(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    server = FdServer(path)
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    server.close()
    assert not path.exists()
    server.close()  # idempotent


def test_stale_socket_file_is_replaced(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # a crashed server leaves its socket file behind
    fd = make_memfd(b"new")
    with FdServer(path) as server:
        server.register("weights", fd)
        received = receive_fd(path, "weights")
        assert os.pread(received, 3, 0) == b"new"
        os.close(received)
    os.close(fd)


def test_live_server_is_not_replaced(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    with FdServer(path):
        with pytest.raises(OSError, match="another server is listening"):
            FdServer(path)
        assert path.exists()


def test_non_socket_file_is_not_replaced(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    path.write_text("not a socket")
    with pytest.raises(OSError, match="is not a socket"):
        FdServer(path)
    assert path.read_text() == "not a socket"


@pytest.mark.parametrize("handle_id", ["", "a\nb", "x" * 257])
def test_register_rejects_bad_handle_ids(sock_dir: Path, handle_id: str) -> None:
    fd = make_memfd(b"x")
    with FdServer(sock_dir / "s.sock") as server:
        with pytest.raises(ValueError, match="handle_id"):
            server.register(handle_id, fd)
    os.close(fd)


def test_register_rejects_a_duplicate_id(sock_dir: Path) -> None:
    fd = make_memfd(b"x")
    with FdServer(sock_dir / "s.sock") as server:
        server.register("weights", fd)
        with pytest.raises(ValueError, match="already registered"):
            server.register("weights", fd)
    os.close(fd)


def test_many_requests_in_a_row(sock_dir: Path) -> None:
    fds = {f"layer-{i}": make_memfd(bytes([i]) * 8) for i in range(5)}
    with FdServer(sock_dir / "s.sock") as server:
        for handle_id, fd in fds.items():
            server.register(handle_id, fd)
        for _ in range(3):
            for i, handle_id in enumerate(fds):
                received = receive_fd(server.path, handle_id)
                assert os.pread(received, 8, 0) == bytes([i]) * 8
                os.close(received)
    for fd in fds.values():
        os.close(fd)
