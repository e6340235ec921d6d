"""Fixtures of the model tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from zerolayer.scheduler.model.kernels import KernelLoader

if TYPE_CHECKING:
    from family_checkpoints import FamilyCheckpoints


@pytest.fixture(scope="module")
def native() -> KernelLoader:
    """The built native kernels, in the per-user build cache (built once per machine and torch);
    a failed build fails the test (a machine without a compiler is not a pass)."""
    loader = KernelLoader()
    if not loader.native_available():
        pytest.fail(f"native kernels did not build: {loader.unavailable_reason}")
    return loader


AVX2_FLAGS = frozenset({"avx2", "fma", "f16c"})
"""The flags x86-64-v3 adds that the AVX2 paths use."""


@pytest.fixture(scope="module")
def kernel_cpu_flags(native: KernelLoader) -> frozenset[str]:
    """The CPU's flags (``/proc/cpuinfo``) the loaded kernels may use under their build's cap:
    all in a native build, AVX2's in one capped at avx2 (``ZEROLAYER_CPU_ISA=avx2``), none in a
    portable one."""
    with open("/proc/cpuinfo") as cpuinfo:
        flags = frozenset(cpuinfo.read().split())
    cap = native.load().isa_cap
    return flags if cap == "native" else flags & AVX2_FLAGS if cap == "avx2" else frozenset()


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> FamilyCheckpoints:
    """Every family's tiny checkpoint in float32 and bfloat16 with transformers' greedy answers
    to :func:`test_llama_parity.make_prompts` (FAMILY_NEW_TOKENS each), each made once per
    session on first use."""
    # NOTE: imported here, not at the top: they import transformers (seconds), which the other
    # model tests do not need.
    from family_checkpoints import FAMILY_NEW_TOKENS, FamilyCheckpoints
    from test_llama_parity import make_prompts

    return FamilyCheckpoints(tmp_path_factory.mktemp("families"), make_prompts(), FAMILY_NEW_TOKENS)
