"""Tests for the native bfloat16 decode GEMV (csrc/skinny_linear.cpp) against torch's linear, and
for when KernelLoader.linear takes it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import biased_linear, grouped_linear
from zerolayer.scheduler.model.native.library import NativeKernels


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x.double(), w.double())


@pytest.mark.parametrize("kernel", ["skinny_linear", "skinny_linear_widened"])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("n", "k"), [(1, 16), (7, 32), (5, 48), (256, 768), (2048, 768), (768, 2048)]
)
def test_matches_a_float64_reference_within_bfloat16_rounding(
    native: KernelLoader, kernel: str, m: int, n: int, k: int
) -> None:
    # skinny_linear takes AVX-512 BF16's dot product where the CPU has it (K = 48: a tail of 16).
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    y = getattr(native.load(), kernel)(x, w)
    want = reference(x, w)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    # One bfloat16 rounding of the float32 sum: relative 2^-8, plus float32 accumulation error.
    tol = want.abs() * 2.0**-8 + 1e-4 * k**0.5
    assert ((y.double() - want).abs() <= tol).all()
    # And as close to the reference as torch's own kernel is, up to one bfloat16 ulp.
    torch_err = (F.linear(x, w).double() - want).abs().max()
    assert (y.double() - want).abs().max() <= torch_err + want.abs().max() * 2.0**-7


def test_the_path_is_the_best_the_cpu_and_the_build_allow(
    native: KernelLoader, kernel_cpu_flags: frozenset[str]
) -> None:
    module = native.load()
    assert module.has_bf16_dot == ("avx512_bf16" in kernel_cpu_flags)
    if "avx512_bf16" in kernel_cpu_flags:
        assert module.skinny_linear_isa == "avx512bf16"
    elif {"avx512f", "avx512bw", "avx512vl"} <= kernel_cpu_flags:
        assert module.skinny_linear_isa == "avx512"
    elif {"avx2", "fma"} <= kernel_cpu_flags:
        assert module.skinny_linear_isa == "avx2"
    else:
        assert module.skinny_linear_isa == "portable"


ISAS = ("avx512bf16", "avx512", "avx2", "portable")


def with_isa(module: NativeKernels, x: torch.Tensor, w: torch.Tensor, isa: str) -> torch.Tensor:
    """The path isa's result, or the test skipped where this CPU or build does not run it."""
    try:
        return module.skinny_linear_with_isa(x, w, isa)
    except RuntimeError as error:
        assert "does not run on this CPU" in str(error)
        pytest.skip(f"{isa}: not on this CPU or build")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k"), [(1, 16), (7, 48), (70, 768), (9, 2048)])
def test_every_path_matches_a_float64_reference(
    native: KernelLoader, isa: str, m: int, n: int, k: int
) -> None:
    # K = 16 and 48: the AVX2 path's lone 16-column step; 70 rows: blocks of 4 (or 2) weight rows
    # and a remainder.
    gen = torch.Generator().manual_seed(m * 100 + n + k)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    y = with_isa(native.load(), x, w, isa)
    want = reference(x, w)
    assert ((y.double() - want).abs() <= want.abs() * 2.0**-8 + 1e-4 * k**0.5).all()


def test_the_best_path_is_the_one_skinny_linear_isa_names(native: KernelLoader) -> None:
    module = native.load()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(40, 64, generator=gen).to(torch.bfloat16)
    assert torch.equal(
        module.skinny_linear(x, w), module.skinny_linear_with_isa(x, w, module.skinny_linear_isa)
    )
    with pytest.raises(RuntimeError, match="unknown ISA sse9"):
        module.skinny_linear_with_isa(x, w, "sse9")


@pytest.mark.parametrize("kernel", ["skinny_linear", "skinny_linear_widened"])
def test_rounds_to_nearest_and_keeps_special_values(native: KernelLoader, kernel: str) -> None:
    x = torch.ones(1, 16, dtype=torch.bfloat16)
    w = torch.zeros(4, 16, dtype=torch.bfloat16)
    w[0, 0] = float("nan")
    w[1, 0] = float("inf")
    w[2, 0] = 1.0 + 2.0**-7  # representable; 16 of them sum to a value needing rounding
    w[2, 1:] = 1.0 + 2.0**-7
    w[3, 0] = -3.0
    y = getattr(native.load(), kernel)(x, w)
    assert torch.isnan(y[0, 0])
    assert y[0, 1] == float("inf")
    assert y[0, 2] == F.linear(x.float(), w.float())[0, 2].to(torch.bfloat16)
    assert y[0, 3] == -3.0


def test_rejects_what_it_does_not_handle(native: KernelLoader) -> None:
    module = native.load()
    w = torch.zeros(8, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="rows of x"):
        module.skinny_linear(torch.zeros(module.max_skinny_rows + 1, 32, dtype=torch.bfloat16), w)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        module.skinny_linear(
            torch.zeros(1, 24, dtype=torch.bfloat16), torch.zeros(8, 24).bfloat16()
        )
    with pytest.raises(RuntimeError, match="bfloat16"):
        module.skinny_linear(torch.zeros(1, 32), w.float())
    with pytest.raises(RuntimeError, match="columns"):
        module.skinny_linear(torch.zeros(1, 16, dtype=torch.bfloat16), w)


def test_loader_linear_uses_the_kernel_only_where_it_applies(native: KernelLoader) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 48, generator=gen).to(torch.bfloat16)
    calls: list[tuple[int, ...]] = []
    module = native.load()

    class Spy:
        def try_skinny_linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
            y = module.try_skinny_linear(x, weight)
            if y is not None:
                calls.append(tuple(x.shape))
            return y

        def try_bf16_gemm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
            return module.try_bf16_gemm(x, weight)

    native._module = Spy()  # type: ignore[assignment]
    try:
        for rows in (1, module.max_skinny_rows, module.max_skinny_rows + 1):
            x = torch.randn(rows, 48, generator=gen).to(torch.bfloat16)
            assert torch.allclose(
                native.linear(x, w).float(), F.linear(x, w).float(), rtol=2e-2, atol=2e-2
            )
        native.linear(torch.randn(1, 48), w.float())  # float32: torch
        native.linear(torch.randn(1, 40).bfloat16(), torch.randn(8, 40).bfloat16())  # K % 16
        native.linear(torch.randn(1, 48).bfloat16(), w.t().contiguous().t())  # strided weight
    finally:
        native._module = module
    assert calls == [(1, 48), (module.max_skinny_rows, 48)]


@pytest.mark.parametrize("m", [1, 3])
def test_multi_gives_exactly_what_one_call_per_weight_gives(native: KernelLoader, m: int) -> None:
    # Shapes of a q, k, v (GQA: k and v narrower) and of a gate, up pair; weights large enough
    # that the rows split across threads, with a thread's range straddling two weights.
    gen = torch.Generator().manual_seed(m)
    module = native.load()
    for shapes in ([(768, 768), (256, 768), (256, 768)], [(2048, 768), (2048, 768)], [(7, 32)]):
        x = torch.randn(m, shapes[0][1], generator=gen).to(torch.bfloat16)
        ws = [torch.randn(n, k, generator=gen).to(torch.bfloat16) for n, k in shapes]
        ys = module.skinny_linear_multi(x, ws)
        assert [tuple(y.shape) for y in ys] == [(m, n) for n, _ in shapes]
        for y, w in zip(ys, ws, strict=True):
            assert torch.equal(y, module.skinny_linear(x, w))
            assert torch.allclose(y.float(), F.linear(x, w).float(), rtol=2e-2, atol=2e-2)


def test_multi_reads_the_weights_in_place(native: KernelLoader) -> None:
    # Views into one mapped buffer, as the loader hands them out: no copy is made or needed.
    buffer = torch.randn(96, 32).to(torch.bfloat16)
    q, k = buffer[:64], buffer[64:]
    x = torch.randn(1, 32).to(torch.bfloat16)
    yq, yk = native.load().skinny_linear_multi(x, [q, k])
    assert torch.equal(yq, native.load().skinny_linear(x, q))
    assert torch.equal(yk, native.load().skinny_linear(x, k))


def test_multi_rejects_what_it_does_not_handle(native: KernelLoader) -> None:
    module = native.load()
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="at least one"):
        module.skinny_linear_multi(x, [])
    with pytest.raises(RuntimeError, match="columns"):
        module.skinny_linear_multi(
            x, [torch.zeros(8, 32).bfloat16(), torch.zeros(8, 48).bfloat16()]
        )
    with pytest.raises(RuntimeError, match="contiguous"):
        module.skinny_linear_multi(x, [torch.zeros(32, 8).bfloat16().t()])


def test_loader_linears_uses_one_call_only_where_it_applies(native: KernelLoader) -> None:
    gen = torch.Generator().manual_seed(1)
    ws = [torch.randn(n, 48, generator=gen).to(torch.bfloat16) for n in (64, 16, 16)]
    calls: list[int] = []
    module = native.load()

    class Spy:
        try_skinny_linear = module.try_skinny_linear
        try_bf16_gemm = module.try_bf16_gemm

        def try_skinny_linear_multi(self, x: torch.Tensor, weights: list) -> list | None:
            ys = module.try_skinny_linear_multi(x, weights)
            if ys is not None:
                calls.append(len(weights))
            return ys

    native._module = Spy()  # type: ignore[assignment]
    try:
        x = torch.randn(1, 48, generator=gen).to(torch.bfloat16)
        for y, w in zip(native.linears(x, ws), ws, strict=True):
            assert torch.equal(y, module.skinny_linear(x, w))
        big = torch.randn(module.max_skinny_rows + 1, 48, generator=gen).to(torch.bfloat16)
        assert [tuple(y.shape) for y in native.linears(big, ws)] == [(5, 64), (5, 16), (5, 16)]
        native.linears(x, [ws[0], ws[1].t().contiguous().t()])  # a strided weight
        native.linears(x, ws[:1])  # a single weight: linear
    finally:
        native._module = module
    assert calls == [3]


def test_the_model_groups_projections_without_biases_into_one_call(native: KernelLoader) -> None:
    gen = torch.Generator().manual_seed(2)
    ws = tuple(torch.randn(n, 32, generator=gen).to(torch.bfloat16) for n in (32, 16, 16))
    biases = tuple(torch.randn(n, generator=gen).to(torch.bfloat16) for n in (32, 16, 16))
    x = torch.randn(1, 32, generator=gen).to(torch.bfloat16)
    calls: list[int] = []
    real = native.linears

    def spy(x: torch.Tensor, weights: tuple) -> list:
        calls.append(len(weights))
        return real(x, weights)

    native.linears = spy  # type: ignore[method-assign]
    try:
        linears = grouped_linear(biased_linear(native.linear, fuse_bias=True), native)
        assert [tuple(y.shape) for y in linears(x, ws)] == [(1, 32), (1, 16), (1, 16)]
        for y, w, b in zip(linears(x, ws, biases), ws, biases, strict=True):
            assert torch.equal(y, F.linear(x, w, b))
    finally:
        del native.linears
    assert calls == [3]
