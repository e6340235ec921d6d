"""The device check's bench (benchmarks/device/check.py) on the CPU: its report is on disk
after every phase, a run out of budget or stopped by SIGTERM ends with what it measured and ``ok``
false (a SIGTERM while its stack stops waits for the stop), and figures off the Triton path or
without CUDA graphs on a GPU are flagged. (The whole bench runs in the script's dry run:
tests/benchmarks/test_device_check_script.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.device import check as device_check
from benchmarks.device.report import Budget, BudgetExhausted, Interrupted, Report, sigterm_held

REPO_ROOT = Path(__file__).resolve().parents[2]
PHASES = ["model", "bandwidth", "serving", "batch1", "throughput", "loader_kill", "hf"]
"""The bench's phases on the CPU, in order."""


def test_the_report_file_holds_every_finished_phase(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    report = Report(str(path), {"device": "cuda:0"})
    assert not path.exists()
    report.phase("model", {"weight_bytes": 10})
    assert json.loads(path.read_text()) == {
        "device": "cuda:0",
        "phases_done": ["model"],
        "problems": [],
        "model": {"weight_bytes": 10},
    }
    report.problem("no decode CUDA graph was captured")
    report.phase("bandwidth", {"copy_bytes_per_s": 1.5})
    doc = json.loads(path.read_text())
    assert doc["phases_done"] == ["model", "bandwidth"]
    assert doc["problems"] == ["no decode CUDA graph was captured"]
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_the_budget_names_the_phase_it_ran_out_in() -> None:
    assert 9 < Budget(10).left("batch1") <= 10
    with pytest.raises(BudgetExhausted, match="the budget ran out in phase loader_kill"):
        Budget(-1).left("loader_kill")


@pytest.mark.parametrize(
    ("device", "serving", "problems"),
    [
        ("cuda:0", {"attention_backend": "triton", "num_cuda_graphs": 7}, []),
        (
            "cuda:0",
            {"attention_backend": "reference", "num_cuda_graphs": 0},
            [
                "attention ran on 'reference', not Triton: the figures below are not the "
                "serving path's",
                "no decode CUDA graph was captured: decode figures are eager steps'",
            ],
        ),
        ("cpu", {"attention_backend": "native", "num_cuda_graphs": 0}, []),
    ],
)
def test_figures_off_the_serving_path_are_problems(
    device: str, serving: dict, problems: list[str]
) -> None:
    report = Report("", {})
    report.phase("serving", serving)
    device_check.check_serving(report, torch.device(device))
    assert report.doc["problems"] == problems


def test_a_run_out_of_budget_stops_before_the_stack_and_keeps_its_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    report_path = tmp_path / "report.json"
    doc = device_check.main(
        ["--device", "cpu", "--preset", "tiny", "--copy-bytes", "4096", "--budget-s", "0.001"]
        + ["--report", str(report_path), "--skip-hf", "--log-dir", str(tmp_path / "logs")]
    )
    assert doc["error"] == "the budget ran out in phase serving"
    assert (doc["phases_done"], doc["ok"]) == (["model", "bandwidth"], False)
    assert json.loads(report_path.read_text()) == doc
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_sigterm_ends_the_run_with_what_it_measured(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.device.check",
            "--device",
            "cpu",
            "--preset",
            "tiny",
        ]
        + ["--copy-bytes", str(512 << 20), "--report", str(report_path)]
        + ["--log-dir", str(tmp_path / "logs")],
        cwd=REPO_ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not report_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # written once the model phase is done: now copying 10 x 512 MiB
        bench.send_signal(signal.SIGTERM)
        stdout, stderr = bench.communicate(timeout=60)
    finally:
        bench.kill()
    assert bench.returncode == 1, stderr[-2000:]
    doc = json.loads(report_path.read_text())
    assert json.loads(stdout) == doc
    # Most likely still in the copies; a fast machine may be further (the stack then stopped).
    done = len(doc["phases_done"])
    assert doc["phases_done"] == PHASES[:done] and done >= 1
    assert (doc["interrupted"], doc["ok"]) == (f"SIGTERM during phase {PHASES[done]}", False)


def test_a_sigterm_while_the_stack_stops_waits_until_it_stopped() -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted("SIGTERM")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        steps = []
        with pytest.raises(Interrupted, match="SIGTERM"):
            with sigterm_held():
                os.kill(os.getpid(), signal.SIGTERM)  # handled here at once, without the hold
                steps.append("stopped")
        assert steps == ["stopped"]
        assert signal.getsignal(signal.SIGTERM) is interrupt
        with pytest.raises(BudgetExhausted, match="in phase loader_kill"):  # the block's wins
            with sigterm_held():
                os.kill(os.getpid(), signal.SIGTERM)
                raise BudgetExhausted("the budget ran out in phase loader_kill")
        with sigterm_held():  # none arrived: nothing raised
            steps.append("quiet")
        assert steps == ["stopped", "quiet"]
    finally:
        signal.signal(signal.SIGTERM, previous)
