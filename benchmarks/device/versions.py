"""What the device check runs on: package versions, the driver, the kernel, the GPU, and whether
the CUDA paths import (``python -m benchmarks.device.summary versions`` prints it as JSON)."""

from __future__ import annotations

import importlib.metadata
import platform

PACKAGES = ("triton", "cuda-bindings", "nvidia-ml-py", "grpcio", "protobuf", "pytest")


def versions() -> dict:
    """Versions and capabilities; never raises (a failure is the value's text)."""
    doc: dict = {"python": platform.python_version(), "kernel": platform.release()}
    for name in PACKAGES:
        try:
            doc[name.replace("-", "_")] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            doc[name.replace("-", "_")] = None
    doc["pytest_xdist"] = _imports("xdist")
    doc["triton_imports"] = _imports("triton.language")
    doc["cuda_bindings_imports"] = _imports("cuda.bindings.runtime")
    import torch

    doc.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
    doc["cuda_available"] = torch.cuda.is_available()
    if doc["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        doc.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}")
    doc["driver"] = _driver_version()
    return doc


def _imports(module: str) -> bool | str:
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure means that path cannot run
        return f"{type(exc).__name__}: {exc}"
    return True


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no nvidia-ml-py or no driver
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    finally:
        pynvml.nvmlShutdown()
