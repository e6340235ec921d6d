"""The CPU every figure was measured on, and the instruction set a run was forced to.

Figures from a host with AVX-512 say little about one with AVX2 only, so every results file and
every printed summary names the CPU's model, its vector extensions (:data:`VECTOR_EXTENSIONS`),
the ISA the run forced (``$ZEROLAYER_CPU_ISA``), the level torch's kernels run and the path of each
of zerolayer's native kernels (:func:`cpu_facts`, :func:`cpu_line`).

Forcing AVX2 on an AVX-512 host: ``ZEROLAYER_CPU_ISA=avx2`` makes zerolayer load its AVX2-capped
kernels (``zerolayer/scheduler/model/native/build.py``). For torch's own ops to be measured as an
AVX2 host runs them too, :func:`emulate_cpu_isa` sets torch's, oneDNN's and MKL's caps
(:data:`TORCH_AVX2_ENV`) for the bench process and every process it starts (zerolayer's layers and
the baselines inherit its environment), unless the user set them already. llama.cpp reads none of
them: its AVX2 figures come from a build of its own without AVX-512.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

ISA_ENV = "ZEROLAYER_CPU_ISA"
"""zerolayer's variable forcing the native kernels' ISA (``native``, ``avx2``, ``portable``)."""
TORCH_AVX2_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
"""torch's ATen kernels, oneDNN and MKL capped at AVX2: what a forced-AVX2 run sets."""
VECTOR_EXTENSIONS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_bf16",
    "amx_int8",
)
"""The CPU flags (``/proc/cpuinfo``'s names) the kernels of zerolayer and llama.cpp choose by."""


def emulate_cpu_isa(environ: MutableMapping[str, str]) -> dict[str, str]:
    """With ``ZEROLAYER_CPU_ISA=avx2`` in ``environ``, sets each of :data:`TORCH_AVX2_ENV` that
    is not set yet (changes ``environ``). Call it before torch runs its first op: torch reads
    its capability once.

    Returns:
        The variables it set (empty when the run forces nothing, or the user set them all).
    """
    if environ.get(ISA_ENV, "").strip().lower() != "avx2":
        return {}
    added = {name: value for name, value in TORCH_AVX2_ENV.items() if name not in environ}
    environ.update(added)
    return added


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """The first ``model name`` and ``flags`` of ``/proc/cpuinfo`` ("" and none where it cannot
    be read)."""
    cpu, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not cpu:
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return cpu, flags


def cpu_facts() -> dict:
    """The CPU and ISA part of a results file's ``machine``: ``cpu``, ``vector_extensions``,
    ``forced_isa`` (``$ZEROLAYER_CPU_ISA``, ``native`` when unset), ``torch_cpu_capability``,
    ``isa_environment`` (the caps of :data:`TORCH_AVX2_ENV` set in this process) and
    ``native_kernels`` (each kernel's path, or why they are unavailable). Loads the kernels
    (building them first where needed, as the scheduler does)."""
    import torch

    from zerolayer.scheduler.model.kernels import KernelLoader
    from zerolayer.scheduler.model.native.paths import KernelPaths

    cpu, flags = cpu_model_and_flags()
    loader = KernelLoader()
    module = loader.load()
    return {
        "cpu": cpu,
        "vector_extensions": [name for name in VECTOR_EXTENSIONS if name in flags],
        "forced_isa": os.environ.get(ISA_ENV) or "native",
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_environment": {k: os.environ[k] for k in TORCH_AVX2_ENV if k in os.environ},
        "native_kernels": (
            KernelPaths.of(module).as_dict()
            if module is not None
            else f"unavailable: {loader.unavailable_reason}"
        ),
    }


def cpu_line(machine: dict) -> str:
    """One line naming the CPU of a results file's ``machine``: its model and vector extensions,
    the forced ISA, torch's level and the native kernels' level."""
    kernels = machine.get("native_kernels")
    level = kernels["isa_level"] if isinstance(kernels, dict) else "unavailable"
    extensions = " ".join(machine.get("vector_extensions") or ["none listed"])
    return (
        f"{machine.get('cpu') or 'unknown CPU'} ({extensions}); forced ISA "
        f"{machine.get('forced_isa', 'native')}: zerolayer's kernels {level}, torch "
        f"{machine.get('torch_cpu_capability', '?')}"
    )
