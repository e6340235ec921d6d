"""The kvstore program started as ``zerolayer up`` starts it, next to a real loader: an arena that
does not fit its filesystem is refused at start with one line, a restart reopens its arena."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.kv.arena_file import free_bytes

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCK_BYTES = 2 * 2 * 16 * 2 * 8 * 4
"""K and V x 2 layers x 16 tokens x 2 KV heads x 8 dims x 4 bytes (float32): the preset's block."""


def make_preset() -> DummyPreset:
    return DummyPreset(32, 64, 2, 4, 2, 259, max_position_embeddings=128)


@pytest.fixture(scope="module")
def loader_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real loader serving a tiny float32 model on a unix socket."""
    base = tmp_path_factory.mktemp("loader")
    address = f"unix:{base / 'loader.sock'}"
    model_dir = write_dummy_model(base / "model", make_preset())
    loader = subprocess.Popen(
        [sys.executable, "-m", "zerolayer.loader", "--address", address, "--model", str(model_dir)],
        cwd=REPO_ROOT,
        stderr=subprocess.DEVNULL,
    )
    yield address
    loader.terminate()
    loader.wait(timeout=30)


def kvstore_command(loader: str, shm_path: Path, kv_cache_bytes: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "zerolayer.kvstore",
        "--address",
        f"unix:{shm_path.parent / 'kvstore.sock'}",
        "--loader",
        loader,
        "--shm-path",
        str(shm_path),
        "--kv-cache-bytes",
        str(kv_cache_bytes),
    ]


def limit_file_size() -> None:
    """In the child: no file may grow past 1 MiB (writes beyond fail with EFBIG, as ENOSPC on a
    full tmpfs; Python ignores the SIGXFSZ that comes with it)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def run_kvstore(
    loader: str, shm_path: Path, kv_cache_bytes: int, limited: bool = False
) -> subprocess.CompletedProcess[str]:
    """Runs the kvstore until it exits by itself (it only does on an error)."""
    return subprocess.run(
        kvstore_command(loader, shm_path, kv_cache_bytes),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_file_size if limited else None,
        check=False,
    )


def test_an_arena_larger_than_the_free_space_is_refused_at_start(
    loader_address: str, tmp_path: Path
) -> None:
    shm_path = tmp_path / "zl.kv"
    kv_cache_bytes = 2**50  # 1 PiB: per-block structures for it would never finish
    started = time.monotonic()
    result = run_kvstore(loader_address, shm_path, kv_cache_bytes)
    assert time.monotonic() - started < 60
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.splitlines()[-1]
    arena_bytes = kv_cache_bytes // BLOCK_BYTES * BLOCK_BYTES
    prefix = (
        f"zerolayer kvstore: error: --kv-cache-bytes {kv_cache_bytes}: the KV arena needs "
        f"{arena_bytes} bytes at {shm_path}, but only "
    )
    assert last.startswith(prefix) and last.endswith(" bytes are free there"), last
    free_said = int(last.removeprefix(prefix).split()[0])
    assert abs(free_said - free_bytes(str(tmp_path))) < 2**30
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_arena_the_filesystem_cannot_reserve_is_refused_at_start(
    loader_address: str, tmp_path: Path
) -> None:
    shm_path = tmp_path / "zl.kv"
    result = run_kvstore(loader_address, shm_path, 4 << 20, limited=True)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(
        f"zerolayer kvstore: error: --kv-cache-bytes {4 << 20}: cannot reserve the {4 << 20} "
        f"bytes of the KV arena at {shm_path} (File too large); "
    ), last
    assert last.endswith(" bytes are free there")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def serve_once(loader: str, shm_path: Path, limited: bool = False) -> str:
    """Starts a kvstore with a 4 MiB arena, stops it (SIGTERM: the arena stays) once it listens;
    returns its log."""
    process = subprocess.Popen(
        kvstore_command(loader, shm_path, 4 << 20),
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit_file_size if limited else None,
    )
    log = ""
    while "listening on" not in log:
        line = process.stderr.readline()
        assert line, log
        log += line
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    return log


def test_a_restarted_kvstore_reopens_its_reserved_arena(
    loader_address: str, tmp_path: Path
) -> None:
    shm_path = tmp_path / "zl.kv"
    num_blocks = (4 << 20) // BLOCK_BYTES
    log = serve_once(loader_address, shm_path)
    assert f"arena {shm_path} created: {num_blocks} blocks of 16 tokens" in log
    assert shm_path.stat().st_blocks * 512 >= 4 << 20
    # Its pages are its own already: nothing new is reserved, so the file-size limit that
    # refuses a new arena does not stop a restart.
    log = serve_once(loader_address, shm_path, limited=True)
    assert f"arena {shm_path} reopened: {num_blocks} blocks of 16 tokens" in log


def assert_refused_with(
    result: subprocess.CompletedProcess[str], shm_path: Path, reason: str
) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"zerolayer kvstore: error: --shm-path {shm_path}: {reason}"
    )


def test_an_arena_left_open_to_others_is_refused_at_start_not_adopted(
    loader_address: str, tmp_path: Path
) -> None:
    shm_path = tmp_path / "zl.kv"
    serve_once(loader_address, shm_path)  # a matching arena and sidecar, then opened to all
    sidecar = Path(f"{shm_path}.json")
    shm_path.chmod(0o666)
    sidecar.chmod(0o666)
    contents = shm_path.read_bytes(), sidecar.read_bytes()
    result = run_kvstore(loader_address, shm_path, 4 << 20)
    assert_refused_with(
        result,
        shm_path,
        f"{sidecar} has mode 0666, open to other users (the stack makes its files 0600)",
    )
    sidecar.chmod(0o600)
    result = run_kvstore(loader_address, shm_path, 4 << 20)
    assert_refused_with(
        result,
        shm_path,
        f"{shm_path} has mode 0666, open to other users (the stack makes its files 0600)",
    )
    assert (shm_path.read_bytes(), sidecar.read_bytes()) == contents


def test_a_symlink_at_the_arena_path_is_refused_at_start_and_its_target_kept(
    loader_address: str, tmp_path: Path
) -> None:
    shm_path = tmp_path / "zl.kv"
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    target.chmod(0o600)
    shm_path.symlink_to(target)
    result = run_kvstore(loader_address, shm_path, 4 << 20)
    assert_refused_with(result, shm_path, f"{shm_path} is a symbolic link (not followed)")
    assert target.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim", "zl.kv"]
