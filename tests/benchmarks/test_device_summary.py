"""The device check's summary writer (benchmarks/device/summary.py) and what it reads
(benchmarks/device/logs.py): the summary after each step, figures from a bench report cut
short, test counts from junit XML or from a killed pytest's log, skips as failures, the capped logs
archive, and nothing else left in the folder that comes back."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from benchmarks.device import logs as device_logs
from benchmarks.device import summary as device_summary
from benchmarks.device.logs import archive_logs, pytest_counts

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="0" tests="5">
<testcase classname="tests.common.test_cuda_memory" name="test_vmm_round_trip" time="1.0"/>
<testcase classname="tests.common.test_cuda_memory" name="test_ipc_round_trip" time="1.0">
  <failure message="AttributeError: 'cudaIpcMemHandle_t' object has no attribute 'reserved'">
  trace</failure></testcase>
<testcase classname="tests.scheduler.test_cuda_forward" name="test_graphs" time="0.1">
  <error message="gpu-marked test skipped under --gpu-strict: Skipped: needs CUDA and Triton">
  trace</error></testcase>
<testcase classname="tests.scheduler.test_triton_attention" name="test_a" time="0.1"/>
<testcase classname="tests.scheduler.test_triton_attention" name="test_b" time="0.1"/>
</testsuite></testsuites>
"""

KILLED_PYTEST_LOG = """\
============================= test session starts ==============================
[gw0] [ 10%] PASSED tests/sharing/test_cuda_memory.py::test_vmm_round_trip
[gw1] [ 20%] FAILED tests/scheduler/model/test_cuda_forward.py::test_graphs[3]
tests/e2e/test_gpu_stack.py::test_the_gpu_stack_gives_the_in_process_gpu_engines_greedy_ids PASSED
tests/e2e/test_gpu_stack.py::test_killing_the_loader ERROR [ 50%]
tests/e2e/test_gpu_stack.py::test_killing_the_loader SKIPPED (why) [ 50%]
"""

PARTIAL_BENCH = {
    "device": "cuda:0",
    "phases_done": ["model", "bandwidth", "serving", "batch1", "memory"],
    "problems": [],
    "model": {"write_s": 9.5, "weight_bytes": 2200000000, "weight_bytes_per_token": 1935000000},
    "bandwidth": {"copy_bytes_per_s": 4.3e12, "batch1_bound_tok_s": 2222.0},
    "serving": {
        "startup_s": 31.0,
        "attention_backend": "triton",
        "num_cuda_graphs": 7,
        "weights_handle_kind": "CUDA_VMM_FD",
    },
    "batch1": {"decode_tok_s": 900.0, "vs_bandwidth_bound": 0.405},
    "memory": {
        "per_process_bytes": {"loader": 2202009600, "scheduler": None},
        "device_used_bytes": 9e9,
        "note": "NVML charges VMM memory to the process that created it (cuMemCreate)",
    },
    "throughput": {"requests": 64},  # not in phases_done: never finished
    "interrupted": "SIGTERM during phase throughput",
    "ok": False,
}


def step_args(**options: object) -> list[str]:
    """Command-line options of ``step``."""
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


@pytest.fixture
def run(tmp_path: Path):  # noqa: ANN201
    """Calls ``python -m benchmarks.device.summary`` in-process on tmp_path/out and
    tmp_path/work."""
    out, work = tmp_path / "out", tmp_path / "work"

    def call(command: str, *args: str) -> int:
        return device_summary.main([command, *args, "--out", str(out), "--work", str(work)])

    call.out, call.work = out, work  # type: ignore[attr-defined]
    return call


def test_each_step_rewrites_the_summary_with_what_is_known_so_far(run) -> None:  # noqa: ANN001
    out, work = run.out, run.work
    assert run("start", "--steps", "versions,gpu_unit,bench", "--budget-s", "420") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problems"] == [
        "versions: never ran",
        "gpu_unit: never ran",
        "bench: never ran",
    ]
    assert summary["ok"] is False
    (work / "versions.out").write_text(json.dumps({"torch": "2.11.0+cu130", "cuda_available": 1}))
    run("step", "versions", *step_args(exit_code=0, seconds=4, bound_s=25, json=work / "x"))
    assert json.loads((out / "summary.json").read_text())["versions"] is None  # no such file
    run("step", "versions", *step_args(seconds=4, bound_s=25, json=work / "versions.out"))
    (work / "gpu_unit.xml").write_text(JUNIT)
    run(
        "step",
        "gpu_unit",
        *step_args(exit_code=1, seconds=80, bound_s=110, junit=work / "gpu_unit.xml"),
    )
    (work / "bench.json").write_text(json.dumps(PARTIAL_BENCH))
    run(
        "step",
        "bench",
        *step_args(exit_code=124, seconds=125, bound_s=120, json=work / "bench.json"),
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["versions"] == {"torch": "2.11.0+cu130", "cuda_available": 1}
    assert (summary["attention"], summary["num_cuda_graphs"]) == ("triton", 7)
    assert summary["figures"] == {
        "model.write_s": 9.5,
        "model.weight_bytes": 2200000000,
        "model.weight_bytes_per_token": 1935000000,
        "bandwidth.copy_bytes_per_s": 4.3e12,
        "bandwidth.batch1_bound_tok_s": 2222.0,
        "serving.startup_s": 31.0,
        "serving.attention_backend": "triton",
        "serving.num_cuda_graphs": 7,
        "serving.weights_handle_kind": "CUDA_VMM_FD",
        "batch1.decode_tok_s": 900.0,
        "batch1.vs_bandwidth_bound": 0.405,
        "memory.per_process_bytes.loader": 2202009600,
        "memory.per_process_bytes.scheduler": None,
        "memory.device_used_bytes": 9e9,
    }
    assert summary["steps"]["bench"] == {
        "exit_code": 124,
        "seconds": 125,
        "bound_s": 120,
        "status": "timed_out",
        "bench": {
            "ok": False,
            "phases_done": ["model", "bandwidth", "serving", "batch1", "memory"],
            "problems": [],
            "interrupted": "SIGTERM during phase throughput",
        },
    }
    assert summary["tests"] == {
        "gpu_unit": {
            "source": "junit",
            "tests": 5,
            "failed": 1,
            "errors": 1,
            "skipped": 0,
            "passed": 3,
        }
    }
    assert summary["problems"] == [
        "gpu_unit: failed (exit code 1)",
        "gpu_unit: 3 passed, {'failed': 1, 'errors': 1, 'skipped': 0}",
        "bench: timed_out (exit code 124)",
    ]
    assert summary["ok"] is False
    assert run("finish") == 1
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "summary.json"]


def test_junit_names_the_tests_that_did_not_pass(tmp_path: Path) -> None:
    (tmp_path / "j.xml").write_text(JUNIT)
    counts = pytest_counts(str(tmp_path / "j.xml"), "")
    assert counts["not_passed"] == [
        "tests.common.test_cuda_memory::test_ipc_round_trip: failure: AttributeError: "
        "'cudaIpcMemHandle_t' object has no attribute 'reserved'",
        "tests.scheduler.test_cuda_forward::test_graphs: error: gpu-marked test skipped under "
        "--gpu-strict: Skipped: needs CUDA and Triton",
    ]


def test_a_killed_pytest_is_counted_from_its_log(tmp_path: Path) -> None:
    (tmp_path / "gpu.out").write_text(KILLED_PYTEST_LOG)
    counts = pytest_counts(str(tmp_path / "missing.xml"), str(tmp_path / "gpu.out"))
    assert counts == {
        "source": "log (no junit XML: pytest was stopped?)",
        "tests": 4,
        "passed": 2,
        "failed": 1,
        "errors": 0,
        "skipped": 1,
        "not_passed": [
            "tests/scheduler/model/test_cuda_forward.py::test_graphs[3]: FAILED",
            "tests/e2e/test_gpu_stack.py::test_killing_the_loader: SKIPPED",
        ],
    }


def test_a_collect_only_run_counts_the_tests_it_found(tmp_path: Path) -> None:
    log = tmp_path / "gpu.out"
    log.write_text("tests/a.py::test_x\ntests/a.py::test_y[1]\n\n2 tests collected in 0.5s\n")
    assert pytest_counts("", str(log), collect_only=True) == {
        "source": "collect-only",
        "collected": 2,
    }


def test_a_skipped_gpu_test_makes_the_run_fail(run) -> None:  # noqa: ANN001
    run("start", "--steps", "gpu_stack")
    run.work.joinpath("s.xml").write_text(
        '<testsuite tests="2" failures="0" errors="0" skipped="1">'
        '<testcase classname="e2e" name="a"/><testcase classname="e2e" name="b">'
        '<skipped message="no NVML"/></testcase></testsuite>'
    )
    run("step", "gpu_stack", *step_args(seconds=3, bound_s=95, junit=run.work / "s.xml"))
    summary = json.loads((run.out / "summary.json").read_text())
    assert summary["steps"]["gpu_stack"]["status"] == "passed"  # pytest's exit code was 0
    assert summary["problems"] == ["gpu_stack: 1 passed, {'failed': 0, 'errors': 0, 'skipped': 1}"]
    assert run("finish") == 1


def test_the_archive_keeps_the_end_of_each_log_within_the_caps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_logs, "FILE_CAP_BYTES", 100)
    monkeypatch.setattr(device_logs, "TOTAL_CAP_BYTES", 400)
    work = tmp_path / "work"
    (work / "bench-logs").mkdir(parents=True)
    (work / "gpu_unit.out").write_text("x" * 150 + "the end\n")
    (work / "bench.json").write_text("{}")
    (work / "bench-logs" / "scheduler.log").write_text("started\n")
    (work / "bench-logs" / "model.json").write_text("{}")  # only logs are taken from below
    (work / "pytest-tmp").mkdir()
    for i in range(5):
        (work / "pytest-tmp" / f"layer{i}.log").write_text("y" * 90)
    info = archive_logs(work, tmp_path / "logs.tar.gz")
    with tarfile.open(tmp_path / "logs.tar.gz") as tar:
        names = tar.getnames()
        unit_out = tar.extractfile("gpu_unit.out").read().decode()
    assert names == [
        "bench.json",
        "gpu_unit.out",
        "bench-logs/scheduler.log",
        "pytest-tmp/layer0.log",
        "pytest-tmp/layer1.log",
    ]
    assert unit_out == "[... the first 58 bytes were cut ...]\n" + "x" * 92 + "the end\n"
    assert info["cut"] == ["gpu_unit.out"]
    assert info["omitted"] == [
        "pytest-tmp/layer2.log",
        "pytest-tmp/layer3.log",
        "pytest-tmp/layer4.log",
    ]
    assert not list(tmp_path.glob(".*tmp"))


def test_the_printed_summary_fits_the_print_limit(run) -> None:  # noqa: ANN001
    run("start", "--steps", "gpu_unit")
    many = [f"tests.x::test_{i}: failure: {'e' * 190}" for i in range(30)]
    summary = json.loads((run.out / "summary.json").read_text())
    summary["steps"]["gpu_unit"] = {"status": "failed", "tests": {"not_passed": many}}
    summary["figures"] = {f"phase.figure_{i}": float(i) for i in range(100)}
    text = device_summary.compact(summary)
    assert len(text) <= device_summary.PRINT_LIMIT
    doc = json.loads(text)
    assert len(doc["steps"]["gpu_unit"]["tests"]["not_passed"]) == 5
