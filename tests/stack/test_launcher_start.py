"""``Stack.start`` without real processes: what an interruption during start-up does."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import zerolayer.stack.launcher as launcher
from zerolayer.stack import kernel_build
from zerolayer.stack.launcher import Stack, StackConfig, StackError, StartupInterrupted


def test_an_interrupt_while_the_processes_spawn_starts_no_further_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "read_checkpoint", lambda path, **kw: None)
    stack = Stack(StackConfig(model_dir="/models/llama", run_dir=str(tmp_path), schedulers=3))
    started: list[str] = []
    stopped: list[str] = []

    def start_layer(name: str) -> None:
        started.append(name)
        if name == "kvstore":
            stack.interrupt()  # as up's SIGINT/SIGTERM handler does

    monkeypatch.setattr(stack, "start_layer", start_layer)
    monkeypatch.setattr(stack, "stop", lambda: stopped.append("stop"))
    with pytest.raises(StartupInterrupted, match="^interrupted before starting the scheduler$"):
        stack.start()
    assert started == ["loader", "kvstore"]
    assert stopped == ["stop"]


def test_the_health_poll_sees_a_process_that_starts_listening_within_100_ms() -> None:
    options = dict(launcher.POLL_CHANNEL_OPTIONS)
    assert len(options) == len(launcher.POLL_CHANNEL_OPTIONS)  # gRPC would take the first
    assert options["grpc.max_reconnect_backoff_ms"] == 100


def test_a_run_dir_open_to_others_is_refused_not_chmodded(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(StackError, match=f"^--run-dir: {shared}: mode 1777 lets other users in"):
        Stack(StackConfig(model_dir="/models/llama", run_dir=str(shared)))
    assert shared.stat().st_mode & 0o7777 == 0o1777


def test_a_new_run_dir_is_made_private(tmp_path: Path) -> None:
    stack = Stack(StackConfig(model_dir="/models/llama", run_dir=str(tmp_path / "a" / "run")))
    assert stack.run_dir.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_log_file_another_user_put_in_the_log_dir_is_not_written_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o1777)  # a shared directory
    (logs / "loader.log").write_text("")
    os.chown(logs / "loader.log", 65534, -1)
    stack = Stack(StackConfig(model_dir="/m", run_dir=str(tmp_path / "run"), log_dir=str(logs)))
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: pytest.fail("started"))
    with pytest.raises(StackError, match=f"^{logs / 'loader.log'}: not a file of this user"):
        stack.start_layer("loader")
    assert (logs / "loader.log").read_text() == ""


def test_a_new_log_dir_is_made_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs"
    stack = Stack(StackConfig(model_dir="/m", run_dir=str(tmp_path / "run"), log_dir=str(logs)))
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: None)
    stack.start_layer("loader")
    assert logs.stat().st_mode & 0o777 == 0o700


def test_the_kernels_are_built_before_any_layer_starts_and_the_deadline_counts_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "read_checkpoint", lambda path, **kw: None)
    stack = Stack(StackConfig(model_dir="/m", run_dir=str(tmp_path), startup_timeout_s=5.0))
    events: list[tuple[str, float]] = []

    def build(cwd: Path, interrupted: object) -> None:
        events.append(("built", time.monotonic()))

    monkeypatch.setattr(launcher, "build_native_kernels", build)
    monkeypatch.setattr(stack, "start_layer", lambda name: events.append((name, 0.0)))
    monkeypatch.setattr(
        stack, "wait_healthy", lambda name, deadline: events.append((name, deadline))
    )
    monkeypatch.setattr(
        launcher, "Supervisor", lambda stack: type("S", (), {"run": lambda s: None})()
    )
    stack.start()
    assert [name for name, _ in events[:5]] == [
        "built",
        "loader",
        "kvstore",
        "scheduler",
        "frontend",
    ]
    built_at = events[0][1]
    assert all(deadline >= built_at + 5.0 for _, deadline in events[5:])


@pytest.mark.parametrize(
    ("device", "backend", "builds"),
    [("cpu", "native", True), ("cpu", "reference", False), ("cuda:0", "native", False)],
)
def test_only_a_cpu_stack_on_the_native_backend_builds_kernels(
    device: str, backend: str, builds: bool
) -> None:
    config = SimpleNamespace(device=device, attention_backend=backend)
    assert kernel_build.needs_native_kernels(config) is builds  # type: ignore[arg-type]


def test_an_interrupt_stops_a_build_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A build program that would run for a minute, in a module of its own.
    (tmp_path / "slow_build.py").write_text(
        "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n"
    )
    monkeypatch.setattr(kernel_build, "BUILD_MODULE", "slow_build")
    calls = []

    def interrupted() -> bool:
        calls.append(1)
        return len(calls) > 2

    started = time.monotonic()
    with pytest.raises(InterruptedError, match="interrupted while building the native kernels"):
        kernel_build.build_native_kernels(tmp_path, interrupted)
    assert time.monotonic() - started < 30
    assert subprocess.run(["pgrep", "-f", "slow_build"], capture_output=True).stdout == b""
