"""The native bfloat16 GEMM (csrc/bf16_gemm.cpp) against a float64 reference, and when the
scheduler's linear takes it. It runs on any CPU with AVX2 (this one included); the scheduler takes
it only where skinny_linear has no vdpbf16ps (tests/scheduler/model/test_forced_isa.py checks the
routing in the build capped at AVX2)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.native.library import NativeKernels


@pytest.fixture(scope="module")
def module(native: KernelLoader) -> NativeKernels:
    loaded = native.load()
    assert loaded is not None
    if loaded.isa_cap == "portable":
        pytest.skip("a portable build has no GEMM path (the scheduler multiplies with torch)")
    return loaded


@pytest.mark.parametrize("m", [1, 5, 6, 17, 64, 131])
@pytest.mark.parametrize(("n", "k"), [(1, 16), (3, 48), (70, 768), (9, 2048)])
def test_matches_a_float64_reference_within_bfloat16_rounding(
    module: NativeKernels, m: int, n: int, k: int
) -> None:
    # M = 5, 6, 17, 131: tiles of 4 rows of x and a remainder; 131 crosses the 64-row blocks; N
    # odd: a weight row without its pair; K = 16 and 48: the lone 16-column step.
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    y = module.bf16_gemm(x, w)
    want = F.linear(x.double(), w.double())
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    # One bfloat16 rounding of a float32 sum of exact products.
    assert ((y.double() - want).abs() <= want.abs() * 2.0**-8 + 1e-4 * k**0.5).all()


def test_rows_are_the_decode_gemv_of_each_tile(module: NativeKernels) -> None:
    # The same row-block kernel as skinny_linear's AVX2 path, 4 rows of x at a time: bit equal.
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(12, 768, generator=gen).to(torch.bfloat16)
    w = torch.randn(10, 768, generator=gen).to(torch.bfloat16)
    y = module.bf16_gemm(x, w)
    for first in range(0, 12, 4):
        tile = module.skinny_linear_with_isa(x[first : first + 4], w, "avx2")
        assert torch.equal(y[first : first + 4], tile)


def test_does_not_depend_on_the_thread_count(module: NativeKernels) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(40, 256, generator=gen).to(torch.bfloat16)
    w = torch.randn(4096, 256, generator=gen).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = module.bf16_gemm(x, w)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(module.bf16_gemm(x, w), single)
    finally:
        torch.set_num_threads(threads)


def test_rejects_what_it_does_not_handle(module: NativeKernels) -> None:
    w = torch.zeros(8, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="bf16_gemm: K must be a multiple of 16"):
        module.bf16_gemm(torch.zeros(9, 24, dtype=torch.bfloat16), torch.zeros(8, 24).bfloat16())
    with pytest.raises(RuntimeError, match="bf16_gemm: bfloat16 x and w expected"):
        module.bf16_gemm(torch.zeros(9, 32), w.float())
    with pytest.raises(RuntimeError, match="bf16_gemm: x has 16 columns, w 32"):
        module.bf16_gemm(torch.zeros(9, 16, dtype=torch.bfloat16), w)
    with pytest.raises(RuntimeError, match="bf16_gemm: w must be contiguous"):
        module.bf16_gemm(
            torch.zeros(9, 32, dtype=torch.bfloat16), torch.zeros(32, 32).bfloat16().t()
        )
    with pytest.raises(RuntimeError, match=r"bf16_gemm: x \[M, K\] with M >= 1 expected"):
        module.bf16_gemm(torch.zeros(0, 32, dtype=torch.bfloat16), w)


def test_the_scheduler_takes_it_only_without_the_bfloat16_dot_product(
    module: NativeKernels,
) -> None:
    # With vdpbf16ps, oneDNN's bfloat16 GEMM is torch's and faster: None says "use torch".
    assert module.bf16_gemm_isa == (None if module.has_bf16_dot else "avx2")
    x = torch.zeros(module.max_skinny_rows + 1, 32, dtype=torch.bfloat16)
    w = torch.zeros(8, 32, dtype=torch.bfloat16)
    taken = module.try_bf16_gemm(x, w)
    assert (taken is None) == module.has_bf16_dot
    assert module.try_bf16_gemm(x[: module.max_skinny_rows], w) is None  # the GEMV's rows
