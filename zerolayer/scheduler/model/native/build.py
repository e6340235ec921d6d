"""Compiles ``csrc/`` into ``libzerolayer_kernels.so``, in seconds, outside any start-up deadline.

The library includes no torch header and links neither torch nor Python (its C ABI is
``csrc/api.h``), so a build depends only on the sources and headers, the flags and the compiler
(:func:`source_digest`, :func:`build_key`). It is built:

- at install time: ``setup.py`` runs ``build.py --prebuilt`` into :data:`PREBUILT_DIR` in the
  package (git-ignored), next to a stamp naming the sources it was built from;
- when the sources have changed since (a checkout being edited), into a per-user cache,
  ``$ZEROLAYER_KERNEL_CACHE`` or ``~/.cache/zerolayer/kernels``, then ``<build_key>/``: by
  ``zerolayer up`` before it starts the layers, or by the first ``KernelLoader.load()``.

``$ZEROLAYER_CPU_ISA`` (:data:`ISA_ENV`) picks the library's variant (:data:`ISA_VARIANTS`):
``native`` (the default: each hot function chooses its ISA at load time), or ``avx2`` and
``portable``, built with flags of their own that cap what the kernels use (``csrc/cpu_features.h``)
whatever the CPU, to measure and test those paths on a CPU that has more. The flags are part of
the digest, so every variant has its own cache directory; only ``native`` is built at install time.

A build runs as a program of its own, the leader of a new process group (:func:`run_build`):
it compiles the translation units in parallel with a progress line on stderr, holding an flock
on its output directory, so that a build another process started is waited for, not repeated.
It asks for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``) and then kills its whole group:
a parent-death signal is not inherited across fork, so the compilers' own children (``cc1plus``,
``as``) die by the group kill, and no compiler outlives whoever started the build.

Standard library only, and no other zerolayer module: ``setup.py`` runs this file in pip's
isolated build environment, where neither torch nor the package's dependencies are installed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

CSRC_DIR = Path(__file__).resolve().parents[4] / "csrc"
"""The kernels' sources: ``csrc/`` beside the ``zerolayer`` package (a checkout or an editable
install)."""
PREBUILT_DIR = Path(__file__).resolve().parent / "prebuilt"
"""Where ``setup.py`` builds the library at install time (git-ignored)."""
LIBRARY = "libzerolayer_kernels.so"
STAMP = "build.json"
"""Written beside the library once it is complete: ``{"sources": digest, "compiler": ...}``."""
# NOTE: no -march (in the native variant): the sources multiversion their hot functions
# (target_clones) and pick their intrinsics by cpu_has at load time, so a library built here also
# runs on another CPU. -ffp-contract=fast lets vector a * b + c be an FMA.
# -fopenmp: the library's libgomp.so.1 resolves to the one torch has loaded (one runtime).
# -Wno-psabi: the 64-byte vectors only live in always-inline helpers (csrc/simd.h).
CXXFLAGS = (
    "-std=c++17",
    "-O3",
    "-ffp-contract=fast",
    "-fopenmp",
    "-fPIC",
    "-fvisibility=hidden",
    "-Wno-psabi",
)
LDFLAGS = ("-shared", "-fopenmp")
ISA_ENV = "ZEROLAYER_CPU_ISA"
"""The environment variable naming the variant to build and load (read by :func:`isa_variant`)."""
ISA_VARIANTS: dict[str, tuple[str, ...]] = {
    "native": (),
    # NOTE: -march=x86-64-v3 lets the compiler use AVX2, FMA and F16C everywhere; ZL_ISA_CAP=1
    # makes every runtime choice (cpu_has) stop at AVX2 even on an AVX-512 CPU.
    "avx2": ("-march=x86-64-v3", "-DZL_NO_MULTIVERSION", "-DZL_ISA_CAP=1"),
    "portable": ("-DZL_NO_MULTIVERSION", "-DZL_ISA_CAP=0"),
}
"""Each variant's flags beside :data:`CXXFLAGS`: ``native`` (the default) chooses each kernel's
ISA at load time; ``avx2`` and ``portable`` cap it (``csrc/cpu_features.h``)."""
DEFAULT_ISA = "native"
EXIT_FAILED, EXIT_NO_COMPILER, EXIT_BAD_SETTING = 1, 2, 3


class BuildError(RuntimeError):
    """The library could not be built; the message says why (the compiler's last words)."""


def compiler(environ: Mapping[str, str]) -> str:
    """The C++ compiler: ``$CXX`` or ``c++``."""
    return environ.get("CXX", "c++")


def isa_variant(environ: Mapping[str, str]) -> str:
    """The variant ``$ZEROLAYER_CPU_ISA`` names (:data:`ISA_VARIANTS`); ``native`` when unset or
    empty.

    Raises:
        BuildError: another value (the message names the variable and the choices).
    """
    value = environ.get(ISA_ENV, "").strip().lower() or DEFAULT_ISA
    if value not in ISA_VARIANTS:
        choices = ", ".join(ISA_VARIANTS)
        raise BuildError(f"{ISA_ENV}={environ[ISA_ENV]!r}: expected one of {choices}")
    return value


def cxxflags(variant: str = DEFAULT_ISA) -> tuple[str, ...]:
    """The compiler's flags for ``variant``: :data:`CXXFLAGS` and the variant's own."""
    return (*CXXFLAGS, *ISA_VARIANTS[variant])


def source_digest(csrc_dir: Path = CSRC_DIR, variant: str = DEFAULT_ISA) -> str:
    """SHA-256 (hex) of ``variant``'s flags and of every ``*.cpp`` and ``*.h`` of ``csrc_dir``
    (names and contents), whatever the directory's path.

    Raises:
        FileNotFoundError: ``csrc_dir`` holds no source.
        KeyError: ``variant`` is none of :data:`ISA_VARIANTS`.
    """
    sources = sorted([*csrc_dir.glob("*.cpp"), *csrc_dir.glob("*.h")])
    if not sources:
        raise FileNotFoundError(f"{csrc_dir}: no C++ sources")
    digest = hashlib.sha256("\0".join((*cxxflags(variant), *LDFLAGS)).encode())
    for path in sources:
        digest.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def compiler_version(cxx: str) -> str:
    """The first line of ``cxx --version`` (``g++ (Debian 12.2.0-14) 12.2.0``).

    Raises:
        BuildError: the compiler does not run.
    """
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"no C++ compiler: {cxx!r} does not run ({exc})") from None
    if done.returncode != 0 or not done.stdout.strip():
        raise BuildError(f"no C++ compiler: {cxx} --version exited with {done.returncode}")
    return done.stdout.splitlines()[0].strip()


def build_key(digest: str, version: str) -> str:
    """16 hex digits naming one build: the sources' digest and the compiler's version."""
    return hashlib.sha256(f"{digest}\0{version}".encode()).hexdigest()[:16]


def cache_dir(digest: str, version: str, environ: Mapping[str, str]) -> Path:
    """``$ZEROLAYER_KERNEL_CACHE`` or ``~/.cache/zerolayer/kernels``, then the build key.

    Not under ``$XDG_CACHE_HOME``: tests and benchmarks give each stack its own model cache, and
    need not build the kernels again for each.
    """
    root = environ.get("ZEROLAYER_KERNEL_CACHE") or str(Path.home() / ".cache/zerolayer/kernels")
    return Path(root) / build_key(digest, version)


def built_library(out_dir: Path, digest: str | None) -> Path | None:
    """The library in ``out_dir`` if a build of the sources of ``digest`` completed there
    (None: any completed build, for a package installed without ``csrc/``); else None."""
    try:
        stamp = json.loads((out_dir / STAMP).read_text())
    except (OSError, ValueError):
        return None
    library = out_dir / LIBRARY
    if (digest is not None and stamp.get("sources") != digest) or not library.is_file():
        return None
    return library


def build(out_dir: Path, cxx: str, csrc_dir: Path = CSRC_DIR, variant: str = DEFAULT_ISA) -> Path:
    """Builds the library (``variant`` of :data:`ISA_VARIANTS`) into ``out_dir`` unless a build
    of these sources and flags is there; another process building into the same directory is
    waited for (an flock), not repeated.

    Returns:
        The library's path.

    Raises:
        BuildError: a compiler or the linker failed (its output is in the message).
    """
    digest = source_digest(csrc_dir, variant)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _locked(out_dir):
        if (library := built_library(out_dir, digest)) is not None:
            return library
        version = compiler_version(cxx)
        for stale in out_dir.glob("build-*"):  # left by a build that was killed
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix="build-", dir=out_dir))
        try:
            flags = cxxflags(variant)
            _compile_and_link(cxx, flags, sorted(csrc_dir.glob("*.cpp")), work, out_dir)
            # NOTE: a new inode, never written in place: a process that has the old library
            # mapped keeps it.
            os.replace(work / LIBRARY, out_dir / LIBRARY)
            stamp = {
                "sources": digest,
                "compiler": version,
                "cxxflags": list(flags),
                "isa": variant,
            }
            (work / STAMP).write_text(json.dumps(stamp))
            os.replace(work / STAMP, out_dir / STAMP)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out_dir / LIBRARY


@contextlib.contextmanager
def _locked(out_dir: Path) -> Iterator[None]:
    """Holds an exclusive flock on ``out_dir/build.lock`` (released when this process dies)."""
    with open(out_dir / "build.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"waiting for the native kernel build another process started in {out_dir}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _compile_and_link(
    cxx: str, flags: tuple[str, ...], sources: list[Path], work: Path, out_dir: Path
) -> None:
    """Compiles ``sources`` with ``flags`` in parallel (one per CPU this process may use) into
    ``work`` and links ``work/LIBRARY``, with a progress line on stderr."""
    jobs = max(1, min(len(sources), len(os.sched_getaffinity(0))))
    start = time.monotonic()
    progress = f"zerolayer: building the native kernels ({len(sources)} files, {jobs} at a time)"
    if variant_flags := [f for f in flags if f not in CXXFLAGS]:
        progress += f" with {' '.join(variant_flags)}"
    _say(f"{progress} in {out_dir}")
    objects = [work / f"{source.stem}.o" for source in sources]
    include = f"-I{sources[0].parent}"
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        runs = [
            pool.submit(_run, [cxx, *flags, include, "-c", str(src), "-o", str(obj)], src.name)
            for src, obj in zip(sources, objects, strict=True)
        ]
        for done, run in enumerate(concurrent.futures.as_completed(runs), 1):
            run.result()
            if sys.stderr.isatty():
                print(f"\r{progress}: {done}/{len(runs)}", end="", file=sys.stderr, flush=True)
    _run([cxx, *LDFLAGS, "-o", str(work / LIBRARY), *map(str, objects)], LIBRARY)
    end = "\n" if sys.stderr.isatty() else ""
    _say(f"{end}zerolayer: native kernels built in {time.monotonic() - start:.1f} s")


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        output = (done.stderr + done.stdout).strip()[-3000:]
        raise BuildError(f"{what}: {command[0]} exited with {done.returncode}:\n{output}")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_build(
    out_dir: Path | None = None, *, prebuilt: bool = False, variant: str = DEFAULT_ISA
) -> Path:
    """Runs this file as a build program (:func:`main`) and waits for it: the leader of a new
    process group that dies, compilers and all, with the calling thread (or when this call is
    interrupted). Its progress goes to this process's stderr.

    Args:
        out_dir: where to build; None: :data:`PREBUILT_DIR` with ``prebuilt``, else the cache.
        variant: which of :data:`ISA_VARIANTS` (``prebuilt``: ``native`` only).

    Returns:
        The library's path.

    Raises:
        BuildError: the build failed, or no compiler (the program's one-line reason).
    """
    command = [sys.executable, str(Path(__file__).resolve()), "--parent-pid", str(os.getpid())]
    command += ["--isa", variant]
    if out_dir is not None:
        command += ["--out", str(out_dir)]
    elif prebuilt:
        command.append("--prebuilt")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        answer, _ = process.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    if process.returncode != 0:
        raise BuildError(answer.strip() or f"the build exited with {process.returncode}")
    return Path(answer.strip())


def _die_with_parent(parent_pid: int) -> None:
    """Kills this process's group when the parent dies, or when this process gets SIGTERM,
    SIGINT or SIGHUP (the group's other members are the compilers)."""

    def kill_group(*_: object) -> None:
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)  # the compilers, then this process
        os._exit(128 + signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, kill_group)
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        kill_group()


def main(argv: list[str] | None = None) -> int:
    """``python -m zerolayer.scheduler.model.native.build``: makes sure the library of the
    current sources is built (the install-time one, else the cache's, else a new build), in the
    variant ``--isa`` or ``$ZEROLAYER_CPU_ISA`` names (``native`` by default).

    Prints the library's path on stdout and exits 0; or prints why not and exits 1 (the build
    failed: the compiler's output is on stderr too), 2 (no compiler, or no sources) or 3 (an
    unknown ``$ZEROLAYER_CPU_ISA``).
    """
    parser = argparse.ArgumentParser(prog="zerolayer.scheduler.model.native.build")
    parser.add_argument(
        "--csrc", type=Path, default=CSRC_DIR, help="the sources (default %(default)s)"
    )
    parser.add_argument("--out", type=Path, help="build into this directory")
    parser.add_argument("--prebuilt", action="store_true", help=f"build into {PREBUILT_DIR}")
    parser.add_argument(
        "--isa", choices=ISA_VARIANTS, help=f"the variant to build (default: ${ISA_ENV} or native)"
    )
    parser.add_argument("--parent-pid", type=int, help="die, compilers and all, with this parent")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        _die_with_parent(args.parent_pid)
    cxx = compiler(os.environ)
    try:
        variant = args.isa or isa_variant(os.environ)
    except BuildError as exc:
        print(exc)
        return EXIT_BAD_SETTING
    try:
        if args.prebuilt and variant != DEFAULT_ISA:
            raise BuildError(f"--prebuilt builds the native variant only, not {variant}")
        digest = source_digest(args.csrc, variant)
        out_dir = args.out or (PREBUILT_DIR if args.prebuilt else None)
        if out_dir is None:
            if (library := built_library(PREBUILT_DIR, digest)) is not None:
                print(library)
                return 0
            out_dir = cache_dir(digest, compiler_version(cxx), os.environ)
        print(build(out_dir, cxx, args.csrc, variant))
        return 0
    except FileNotFoundError as exc:
        print(f"no sources: {exc}")
        return EXIT_NO_COMPILER
    except BuildError as exc:
        print(exc)
        if str(exc).startswith("no C++ compiler"):
            return EXIT_NO_COMPILER
        print(exc, file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
