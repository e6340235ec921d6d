"""Build hook: generate the Python gRPC code from protos/ with grpcio-tools before packaging.

The generated modules (zerolayer/v1/*_pb2*.py) are git-ignored and never edited by hand.
"""

from __future__ import annotations

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


if __name__ == "__main__":  # setuptools runs this file as __main__; device_wheels.sh imports it
    generate_protos()
    setup()
