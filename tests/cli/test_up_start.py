"""``zerolayer up``'s start-up: the native kernels are built (or waited for) before the layers
start and outside the start-up deadline, the deadline's error names the layer still starting,
and the line that says where the stack serves."""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import time
from pathlib import Path

import pytest
from cli.test_cli import STORY, isolated_env, zerolayer
from e2e.stack import free_port

from zerolayer.cli.serving_line import serving_line
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.native import build
from zerolayer.scheduler.model.native.paths import KernelPaths
from zerolayer.stack.config import StackConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def unbuilt_checkout(tmp_path: Path) -> Path:
    """A copy of the package and csrc/ without the library ``pip install`` built into it."""
    copy = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "prebuilt")
    shutil.copytree(ROOT / "zerolayer", copy / "zerolayer", ignore=ignore)
    shutil.copytree(ROOT / "csrc", copy / "csrc")
    return copy


@pytest.mark.e2e
def test_up_waits_for_a_kernel_build_and_its_deadline_does_not_count_it(
    unbuilt_checkout: Path, tmp_path: Path
) -> None:
    library = KernelLoader().load().path  # this checkout's, of the same sources
    env = {**isolated_env(tmp_path), "ZEROLAYER_KERNEL_CACHE": str(tmp_path / "kernels")}
    digest = build.source_digest(unbuilt_checkout / "csrc")
    out = build.cache_dir(digest, build.compiler_version(build.compiler(env)), env)
    out.mkdir(parents=True)
    # Layers start in ~3 s on a busy 2-core machine, but CI's run (the other worker starting its
    # stacks at the same time) once took more than 8 s from the first layer's start to the last
    # one's SERVING.
    deadline_s = 15
    with open(out / "build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a build another process started, still running
        up = zerolayer(
            "up",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--startup-timeout-s",
            str(deadline_s),
            "--generate",
            "Once upon a time",
            env=env,
            cwd=unbuilt_checkout,
        )
        lines = []
        while "waiting for the native kernel build another process started" not in (
            line := up.stderr.readline()
        ):
            assert line, "".join(lines)
            lines.append(line)
        assert not any("listening on" in line for line in lines)  # no layer started yet
        time.sleep(deadline_s + 1)  # the other build takes longer than the start-up deadline
        shutil.copy(library, out / build.LIBRARY)
        (out / build.STAMP).write_text(json.dumps({"sources": digest}))
    answer, err = up.communicate(timeout=300)
    assert up.returncode == 0, err
    assert answer == STORY + "\n"
    # the scheduler loaded the library it waited for: nothing was built
    assert f"loading the native kernels from {out / build.LIBRARY}" in err
    assert "building the native kernels" not in "".join(lines) + err


@pytest.mark.e2e
def test_the_deadline_s_error_names_the_layer_still_starting(tmp_path: Path) -> None:
    flags = ["--listen", f"127.0.0.1:{free_port()}", "--startup-timeout-s", "0.01"]
    up = zerolayer("up", *flags, env=isolated_env(tmp_path))
    _, err = up.communicate(timeout=120)
    assert up.returncode == 1, err
    error = next(line for line in err.splitlines() if line.startswith("zerolayer up: error:"))
    assert re.fullmatch(
        r"zerolayer up: error: loader still starting after --startup-timeout-s 0\.01 "
        r"\(pid \d+, \d+\.\d s of CPU, health: not answering yet\)",
        error,
    ), error


@pytest.mark.e2e
def test_up_serves_on_the_kernel_variant_zerolayer_cpu_isa_names(tmp_path: Path) -> None:
    # The avx2 variant (tests/scheduler/model/test_forced_isa.py builds it, else up does): the
    # scheduler says once which ISA its kernels run, and the story is the native build's.
    env = {**isolated_env(tmp_path), "ZEROLAYER_CPU_ISA": "avx2"}
    flags = ["--listen", f"127.0.0.1:{free_port()}", "--generate", "Once upon a time"]
    up = zerolayer("up", *flags, env=env)
    answer, err = up.communicate(timeout=600)
    assert up.returncode == 0, err
    assert answer == STORY + "\n"
    paths = KernelPaths.of(KernelLoader(isa="avx2").load())
    assert paths.isa_cap == "avx2"
    assert err.count(f"native kernels: {paths.describe()}") == 1


def test_up_refuses_an_unknown_cpu_isa_before_any_layer_starts(tmp_path: Path) -> None:
    env = {**isolated_env(tmp_path), "ZEROLAYER_CPU_ISA": "avx3"}
    up = zerolayer("up", "--listen", f"127.0.0.1:{free_port()}", env=env)
    _, err = up.communicate(timeout=120)
    assert up.returncode == 1, err
    assert "zerolayer up: error: ZEROLAYER_CPU_ISA='avx3': expected one of native, avx2, " in err
    assert "listening on" not in err


def test_the_serving_line_names_every_address_that_is_on(tmp_path: Path) -> None:
    config = StackConfig(model_dir="/m", listen="127.0.0.1:50051")
    assert serving_line(config, tmp_path) == (
        f"zerolayer: serving gRPC on 127.0.0.1:50051; internal sockets in {tmp_path}"
    )
    config = StackConfig(
        model_dir="/m",
        listen="[::1]:50051",
        http_listen="127.0.0.1:8000",
        metrics_port_base=9200,
        metrics_host="::1",
        schedulers=2,
    )
    assert serving_line(config, tmp_path) == (
        "zerolayer: serving gRPC on [::1]:50051, HTTP on http://127.0.0.1:8000, metrics on "
        "[::1]:9200 (loader), :9201 (kvstore), :9202 (scheduler), :9203 (frontend), "
        f":9204 (scheduler-1); internal sockets in {tmp_path}"
    )
