"""scripts/device_check.sh under ``--dry-run`` on the CPU: every step runs its plumbing (the
pytest steps collect the gpu tests, the bench runs the real four-process stack on the tiny model)
within its bound and the 420 s budget, and leaves exactly summary.json and logs.tar.gz in $OUT
and nothing in $TMPDIR; a step past its bound is stopped and the summary still says what
happened."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "device_check.sh"
STEPS = ["setup", "versions", "nvml", "gpu_unit", "gpu_stack", "bench"]
GRACE_S = 5
"""Seconds ``timeout`` waits after SIGTERM before SIGKILL."""


def run_script(
    out: Path, tmp_path: Path, temp_dir: Path, **env: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """Runs the dry run with ``temp_dir`` (empty) as its $TMPDIR, and checks that it left nothing
    there: its work folders, the stack's run directory and the bench's logs are all gone."""
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"],
        cwd=REPO_ROOT,
        env={
            **os.environ,
            "PYTHON": sys.executable,
            "OUT": str(out),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            # torch's compile cache, in $TMPDIR by default: a cache, not something left behind
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torchinductor"),
            "TMPDIR": str(temp_dir),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert sorted(p.name for p in temp_dir.iterdir()) == [], done.stdout[-2000:]
    return done, json.loads((out / "summary.json").read_text())


def declared_bounds() -> dict[str, int]:
    table = re.search(r"declare -A BOUND=\((.*)\)", SCRIPT.read_text())
    assert table is not None
    return {name: int(s) for name, s in re.findall(r"\[(\w+)\]=(\d+)", table.group(1))}


def test_the_bounds_leave_the_summary_its_reserve_in_the_budget() -> None:
    text = SCRIPT.read_text()
    budget = int(re.search(r"^BUDGET_S=(\d+)$", text, re.M).group(1))
    reserve = int(re.search(r"^RESERVE_S=(\d+)$", text, re.M).group(1))
    bounds = declared_bounds()
    assert list(bounds) == STEPS
    assert budget == 420  # 7 minutes, under the device tool's timeout_s=480
    assert sum(bounds.values()) + reserve <= budget


def test_the_dry_run_runs_every_step_and_writes_the_summary(
    tmp_path: Path, short_dir: Path
) -> None:
    out = tmp_path / "out"
    done, summary = run_script(out, tmp_path, short_dir)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "summary.json"]
    assert (summary["dry_run"], summary["ok"], summary["problems"]) == (True, True, [])
    steps = summary["steps"]
    assert list(steps) == STEPS
    bounds = declared_bounds()
    for name, step in steps.items():
        assert step["bound_s"] == bounds[name]
        assert step["seconds"] <= step["bound_s"] + GRACE_S
    assert [s["status"] for s in steps.values()] == ["passed"] * 2 + ["dry_run"] + ["passed"] * 3
    assert summary["elapsed_s"] <= summary["budget_s"]
    versions = summary["versions"]
    assert {"torch", "triton", "cuda_bindings", "nvidia_ml_py", "driver", "kernel"} <= set(versions)
    assert (versions["cuda_available"], versions["driver"]) == (False, None)
    assert steps["nvml"]["nvml"]["problems"] == [
        "NVML unavailable (no nvidia-ml-py, driver or device)"
    ]
    # --gpu-strict collects the gpu tests even here (no CUDA device deselects them otherwise).
    assert steps["gpu_stack"]["tests"] == {"source": "collect-only", "collected": 4}
    assert steps["gpu_unit"]["tests"]["collected"] >= 30
    assert (summary["attention"], summary["num_cuda_graphs"]) == ("native", 0)
    assert steps["bench"]["bench"]["phases_done"] == [
        "model",
        "bandwidth",
        "serving",
        "batch1",
        "throughput",
        "loader_kill",
        "hf",
    ]
    figures = summary["figures"]
    assert figures["batch1.decode_tok_s"] > 0 and figures["hf.padded_batch_tok_s"] > 0
    assert figures["loader_kill.identical_tokens_during_kill"] is True
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"gpu_unit.out", "bench.json", "bench-logs/scheduler.log", "nvml.out"} <= names
    # One line per step, then the summary: all within the last 12,000 characters returned.
    tail = done.stdout[-12000:]
    assert "device check dry run passed (the plumbing only: nothing ran on a GPU)" in tail
    assert json.loads(tail[tail.index("\n{") :])["steps"] == steps
    for name in STEPS:
        assert f"device check: {name} " in done.stdout


def test_a_step_past_its_bound_is_stopped_and_the_summary_says_so(
    tmp_path: Path, short_dir: Path
) -> None:
    out = tmp_path / "out"
    done, summary = run_script(
        out, tmp_path, short_dir, DEVICE_CHECK_STEPS="bench", DEVICE_CHECK_BOUNDS="bench=5"
    )
    assert done.returncode == 1
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "summary.json"]
    bench = summary["steps"]["bench"]
    assert (bench["status"], bench["exit_code"], bench["bound_s"]) == ("timed_out", 124, 5)
    assert bench["seconds"] <= 5 + GRACE_S
    assert summary["problems"] == [
        "setup: not run (not selected (DEVICE_CHECK_STEPS))",
        "versions: not run (not selected (DEVICE_CHECK_STEPS))",
        "nvml: not run (not selected (DEVICE_CHECK_STEPS))",
        "gpu_unit: not run (not selected (DEVICE_CHECK_STEPS))",
        "gpu_stack: not run (not selected (DEVICE_CHECK_STEPS))",
        "bench: timed_out (exit code 124)",
    ]
    assert "device check dry run FAILED" in done.stdout
