"""Build hook: generate the Python gRPC code from protos/ with grpcio-tools, and compile the native
kernels from csrc/, before packaging.

The generated modules (zerolayer/v1/*_pb2*.py) and the kernels' library
(zerolayer/scheduler/model/native/prebuilt/) are git-ignored and never edited by hand.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def generate_protos() -> None:
    """Runs protoc on every protos/zerolayer/**/*.proto into the matching zerolayer.* package.

    Raises:
        RuntimeError: protoc reported an error.
    """
    from grpc_tools import protoc

    proto_dir = ROOT / "protos"
    protos = sorted(
        str(p.relative_to(proto_dir)) for p in (proto_dir / "zerolayer").rglob("*.proto")
    )
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{proto_dir}",
        f"-I{include}",
        f"--python_out={ROOT}",
        f"--pyi_out={ROOT}",
        f"--grpc_python_out={ROOT}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + " ".join(protos))
    for proto in protos:
        package = ROOT / Path(proto).parent
        while package != ROOT:
            (package / "__init__.py").touch()
            package = package.parent


def build_kernels() -> None:
    """Compiles csrc/ into zerolayer/scheduler/model/native/prebuilt/ (seconds, the translation
    units in parallel) where a C++ compiler is there; says so in one line where not (the
    scheduler then builds them into the per-user cache when it starts, or uses the pure-torch
    path without a compiler).

    Runs zerolayer/scheduler/model/native/build.py by its path: it needs only the standard
    library, and pip's isolated build environment has neither torch nor the package installed.
    """
    path = ROOT / "zerolayer" / "scheduler" / "model" / "native" / "build.py"
    spec = importlib.util.spec_from_file_location("zerolayer_native_build", path)
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    try:
        # NOTE: the build backend runs this file once per hook; the stamp makes the later ones
        # free.
        if build.built_library(build.PREBUILT_DIR, build.source_digest()) is None:
            build.run_build(prebuilt=True)
    except (build.BuildError, FileNotFoundError) as exc:
        reason = str(exc).splitlines()[0]
        print(f"zerolayer: native kernels not built at install time: {reason}", file=sys.stderr)


if __name__ == "__main__":  # setuptools runs this file as __main__; device_wheels.sh imports it
    generate_protos()
    build_kernels()
    setup()
