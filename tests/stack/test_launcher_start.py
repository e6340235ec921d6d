"""``Stack.start`` without real processes: what an interruption during start-up does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import zerolayer.stack.launcher as launcher
from zerolayer.stack.launcher import Stack, StackConfig, StackError, StartupInterrupted


def test_an_interrupt_while_the_processes_spawn_starts_no_further_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "read_checkpoint", lambda path: None)
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
