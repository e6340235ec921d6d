"""The native kernels' build (zerolayer/scheduler/model/native/build.py): what its key depends on
(the sources, the flags of each ISA variant, the compiler),
which library is used, one build for builders that start at once, and no compiler left running
by a build whose starter was killed. Small sources (one short .cpp) keep most builds under a
second; the kill test compiles the real csrc/ (it needs compilers that run for a while)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.native import build

BUILD_PROGRAM = Path(build.__file__)
ANSWER = (
    'extern "C" __attribute__((visibility("default"))) int zl_answer(void) { return ANSWER; }\n'
)


def tiny_csrc(root: Path, answer: int = 42) -> Path:
    """A csrc/ of one source and one header under ``root``."""
    csrc = root / "csrc"
    csrc.mkdir(parents=True)
    (csrc / "answer.h").write_text(f"#define ANSWER {answer}\n")
    (csrc / "answer.cpp").write_text('#include "answer.h"\n' + ANSWER)
    return csrc


def gated_compiler(root: Path) -> tuple[Path, Path, Path]:
    """A C++ compiler that logs each compile (``-c``) and waits for a line on a FIFO before
    running the real one: (the script, its log, the FIFO)."""
    log, gate, script = root / "compiles.log", root / "gate", root / "cxx"
    os.mkfifo(gate)
    script.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" -c "*) echo "$*" >> {log}; read _ < {gate};; esac\n'
        'exec c++ "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log, gate


def test_the_key_is_the_sources_flags_and_compiler_not_the_checkout(tmp_path: Path) -> None:
    first, second = tiny_csrc(tmp_path / "a"), tiny_csrc(tmp_path / "b")
    digest = build.source_digest(first)
    assert build.source_digest(second) == digest  # another clone builds the same library
    (second / "answer.h").write_text("#define ANSWER 42\n// edited\n")
    assert build.source_digest(second) != digest
    assert build.build_key(digest, "g++ 12.2.0") != build.build_key(digest, "g++ 13.1.0")
    environ = {"ZEROLAYER_KERNEL_CACHE": str(tmp_path / "cache")}
    key = build.build_key(digest, "g++ 12.2.0")
    assert build.cache_dir(digest, "g++ 12.2.0", environ) == tmp_path / "cache" / key
    default = Path.home() / ".cache" / "zerolayer" / "kernels" / build.build_key(digest, "v")
    assert build.cache_dir(digest, "v", {}) == default


def test_a_library_serves_only_the_sources_it_was_built_from(tmp_path: Path) -> None:
    csrc, out = tiny_csrc(tmp_path), tmp_path / "out"
    library = build.build(out, build.compiler(os.environ), csrc)
    assert ctypes.CDLL(str(library)).zl_answer() == 42
    assert build.built_library(out, build.source_digest(csrc)) == library
    assert build.built_library(out, None) == library  # a package installed without csrc/
    (csrc / "answer.h").write_text("#define ANSWER 43\n")
    assert build.built_library(out, build.source_digest(csrc)) is None
    assert build.build(out, build.compiler(os.environ), csrc) == library
    # NOTE: loaded from another path: the dynamic loader hands out a loaded library by its name
    copy = tmp_path / "rebuilt.so"
    copy.write_bytes(library.read_bytes())
    assert ctypes.CDLL(str(copy)).zl_answer() == 43
    assert sorted(p.name for p in out.iterdir()) == [build.STAMP, "build.lock", build.LIBRARY]


def test_two_builds_at_once_compile_once_and_the_second_waits(tmp_path: Path) -> None:
    csrc, out = tiny_csrc(tmp_path), tmp_path / "out"
    cxx, log, gate = gated_compiler(tmp_path)
    command = [sys.executable, str(BUILD_PROGRAM), "--csrc", str(csrc), "--out", str(out)]
    env = {**os.environ, "CXX": str(cxx)}

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )

    first = start()
    assert "building the native kernels" in first.stderr.readline()  # it holds the lock
    second = start()
    assert "waiting for the native kernel build another process started" in second.stderr.readline()
    with open(gate, "w") as opened:  # lets the first build's compile run
        opened.write("go\n")
    answers = [process.communicate(timeout=120) for process in (first, second)]
    assert [process.returncode for process in (first, second)] == [0, 0], answers
    assert answers[0][0] == answers[1][0] == f"{out / build.LIBRARY}\n"
    assert len(log.read_text().splitlines()) == 1  # answer.cpp, compiled once


def processes() -> list[tuple[int, str, int, int]]:
    """(pid, name, parent pid, process group id) of every process on the machine."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if entry.name.isdigit():
                text = (entry / "stat").read_text()
                name = text[text.index("(") + 1 : text.rindex(")")]
                fields = text[text.rindex(")") + 2 :].split()
                found.append((int(entry.name), name, int(fields[1]), int(fields[2])))
    return found


def group(pgid: int) -> list[str]:
    """The names of the processes in group ``pgid``."""
    return [name for _, name, _, group in processes() if group == pgid]


def test_killing_the_starter_of_a_build_leaves_no_compiler_running(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from zerolayer.scheduler.model.native import build; "
        "build.run_build(Path(sys.argv[1]))"
    )
    out = str(tmp_path / "out")
    starter = subprocess.Popen([sys.executable, "-c", code, out], stderr=subprocess.PIPE, text=True)
    try:
        assert "building the native kernels" in starter.stderr.readline()
        # the build program, leader of the process group its compilers run in
        [builder] = [pid for pid, _, parent, _ in processes() if parent == starter.pid]
        deadline = time.monotonic() + 60
        while "cc1plus" not in group(builder):  # no event tells when the compiler's child starts
            assert time.monotonic() < deadline, f"no compiler started: {group(builder)}"
            time.sleep(0.02)
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    deadline = time.monotonic() + 10
    while left := group(builder):
        assert time.monotonic() < deadline, f"still running after its starter died: {left}"
        time.sleep(0.05)


def test_the_library_runs_on_torch_s_openmp_runtime(native: KernelLoader) -> None:
    library = native.load().path
    mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()}
    assert str(library.resolve()) in mapped
    # its libgomp.so.1 is the one torch loaded: one OpenMP runtime, one thread pool
    assert len([path for path in mapped if "libgomp" in Path(path).name]) == 1


def test_every_isa_variant_has_its_own_flags_and_key(tmp_path: Path) -> None:
    csrc = tiny_csrc(tmp_path)
    assert build.cxxflags("native") == build.CXXFLAGS
    assert build.cxxflags("avx2")[-3:] == (
        "-march=x86-64-v3",
        "-DZL_NO_MULTIVERSION",
        "-DZL_ISA_CAP=1",
    )
    assert build.cxxflags("portable")[-2:] == ("-DZL_NO_MULTIVERSION", "-DZL_ISA_CAP=0")
    digests = {variant: build.source_digest(csrc, variant) for variant in build.ISA_VARIANTS}
    assert digests["native"] == build.source_digest(csrc)
    assert len(set(digests.values())) == 3  # three cache directories, never one another's library


def test_the_variant_is_zerolayer_cpu_isa_and_an_unknown_one_is_refused() -> None:
    assert build.isa_variant({}) == "native"
    assert build.isa_variant({"ZEROLAYER_CPU_ISA": ""}) == "native"
    assert build.isa_variant({"ZEROLAYER_CPU_ISA": " AVX2"}) == "avx2"
    assert build.isa_variant({"ZEROLAYER_CPU_ISA": "portable"}) == "portable"
    with pytest.raises(build.BuildError) as info:
        build.isa_variant({"ZEROLAYER_CPU_ISA": "avx3"})
    assert str(info.value) == "ZEROLAYER_CPU_ISA='avx3': expected one of native, avx2, portable"


def test_the_build_program_builds_the_variant_the_environment_names(tmp_path: Path) -> None:
    csrc, out = tiny_csrc(tmp_path), tmp_path / "out"
    command = [sys.executable, str(BUILD_PROGRAM), "--csrc", str(csrc), "--out", str(out)]
    env = {**os.environ, "ZEROLAYER_CPU_ISA": "portable"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "with -DZL_NO_MULTIVERSION -DZL_ISA_CAP=0" in done.stderr
    stamp = json.loads((out / build.STAMP).read_text())
    assert stamp["isa"] == "portable"
    assert stamp["sources"] == build.source_digest(csrc, "portable")
    refused = subprocess.run(
        command, capture_output=True, text=True, env={**env, "ZEROLAYER_CPU_ISA": "sse9"}
    )
    assert refused.returncode == build.EXIT_BAD_SETTING
    assert refused.stdout == "ZEROLAYER_CPU_ISA='sse9': expected one of native, avx2, portable\n"


def test_a_forced_variant_never_loads_the_install_time_library(tmp_path: Path) -> None:
    # The prebuilt library is the native one; the avx2 variant of the same sources has another
    # digest, so the loader builds (here: would build) its own.
    digest = build.source_digest(build.CSRC_DIR, "avx2")
    assert build.built_library(build.PREBUILT_DIR, digest) is None
