"""The library built capped at AVX2 (``ZEROLAYER_CPU_ISA=avx2``), as an AVX2-only host runs it,
against the native build's explicit AVX2 paths.

The native build reaches every AVX2 path by name (the ``isa`` arguments, tested against the
references in each kernel's test module); only the capped build shows that the cap holds on a CPU
with more (no AVX-512 path is chosen) and that the scheduler's routing follows it (the bfloat16
GEMM instead of torch's matmul). It is one more build of the library per machine and sources
(about 30-60 s of CPU on 2 cores the first time; cached in the per-user kernel cache like the
native one, so later runs only load it).
"""

from __future__ import annotations

import pytest
import torch

from zerolayer.checkpoints.int8_format import dequantize_weight
from zerolayer.scheduler.model.int8_linear import Int8Weight
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.native.library import NativeKernels
from zerolayer.scheduler.model.native.paths import KernelPaths


@pytest.fixture(scope="module")
def forced() -> KernelLoader:
    loader = KernelLoader(isa="avx2")
    if not loader.native_available():
        pytest.fail(f"the avx2 variant did not build: {loader.unavailable_reason}")
    return loader


@pytest.fixture(scope="module")
def native(forced: KernelLoader) -> KernelLoader:
    """The native variant, whatever ``$ZEROLAYER_CPU_ISA`` the suite runs under."""
    loader = KernelLoader(isa="native")
    if not loader.native_available():
        pytest.fail(f"the native variant did not build: {loader.unavailable_reason}")
    return loader


@pytest.fixture(scope="module")
def avx2(forced: KernelLoader) -> NativeKernels:
    with open("/proc/cpuinfo") as cpuinfo:
        if not {"avx2", "fma"} <= set(cpuinfo.read().split()):
            pytest.skip("this CPU has no AVX2")
    module = forced.load()
    assert module is not None
    return module


def test_the_cap_holds_on_any_cpu(forced: KernelLoader, native: KernelLoader) -> None:
    module = forced.load()
    assert module is not None and module.isa_cap == "avx2"
    assert module.path != native.load().path  # a cache directory of its own
    assert module.isa_level in ("avx2", "portable")
    assert not module.has_bf16_dot
    assert module.int8_linear_isa(32) in ("avx2", "portable")


def test_every_kernel_takes_its_avx2_path(avx2: NativeKernels) -> None:
    assert KernelPaths.of(avx2, int8_group_size=32) == KernelPaths(
        "avx2", "avx2", "avx2", "avx2", "avx2", "avx2", 32
    )


def test_the_forced_build_computes_what_the_native_build_s_avx2_paths_do(
    avx2: NativeKernels, native: KernelLoader
) -> None:
    full = native.load()
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(70, 768, generator=gen).to(torch.bfloat16)
    for m in (1, 2, 3, 4):
        x = torch.randn(m, 768, generator=gen).to(torch.bfloat16)
        assert torch.equal(avx2.skinny_linear(x, w), full.skinny_linear_with_isa(x, w, "avx2"))
        q = torch.randint(-127, 128, (70, 768), dtype=torch.int8, generator=gen)
        weight = Int8Weight(q, torch.rand(70, 24, generator=gen) / 100)
        assert torch.equal(
            avx2.int8_linear(x, *weight.tensors()),
            full.int8_linear_with_isa(x, *weight.tensors(), "avx2"),
        )
    x = torch.randn(37, 768, generator=gen).to(torch.bfloat16)
    assert torch.equal(avx2.bf16_gemm(x, w), full.bf16_gemm(x, w))


def test_the_forced_attention_is_the_native_build_s_avx2_path(
    avx2: NativeKernels, native: KernelLoader
) -> None:
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache = (torch.randn(8, 16, 2, 64, generator=gen).bfloat16() for _ in range(2))
    q = torch.randn(21, 4, 64, generator=gen).bfloat16()
    starts, lens = torch.tensor([0, 1, 21]), torch.tensor([40, 20])
    tables = torch.tensor([[5, 2, 7], [0, 3, 0]])
    args = (q, k_cache, v_cache, starts, lens, tables, 0.125)
    assert torch.equal(avx2.paged_attention(*args), native.load().paged_attention(*args, "avx2"))


def test_the_scheduler_multiplies_more_rows_with_the_native_gemm(
    forced: KernelLoader, avx2: NativeKernels
) -> None:
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(64, 256, generator=gen).to(torch.bfloat16)
    x = torch.randn(avx2.max_skinny_rows + 3, 256, generator=gen).to(torch.bfloat16)
    assert avx2.bf16_gemm_isa == "avx2"
    assert torch.equal(forced.linear(x, w), avx2.bf16_gemm(x, w))
    # int8 weights beyond the decode rows: blocks of rows dequantized, then that same GEMM
    q = torch.randint(-127, 128, (64, 256), dtype=torch.int8, generator=gen)
    weight = Int8Weight(q, torch.rand(64, 8, generator=gen) / 100)
    dequantized = dequantize_weight(q, weight.scales, torch.bfloat16)
    assert torch.equal(forced.linear(x, weight), avx2.bf16_gemm(x, dequantized))


def test_the_batch_invariant_kernel_gives_the_avx512_clone_s_bits(
    avx2: NativeKernels, native: KernelLoader
) -> None:
    # The AVX2 tiles run the same fused multiply-add per lane and the same tree as the 16-float
    # clone: equal wherever both run (K = 200: a partial last chunk; 70 rows: packed tiles).
    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.randn(37, 200, generator=gen).to(dtype)
        for m in (1, 3, 70):
            x = torch.randn(m, 200, generator=gen).to(dtype)
            want = native.load().invariant_linear(x, w)
            assert torch.equal(avx2.invariant_linear(x, w), want)
