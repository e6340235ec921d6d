"""Tests for the native bfloat16 decode GEMV (csrc/skinny_linear.cpp) against torch's linear, and
for when KernelLoader.linear takes it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zerolayer.scheduler.model.kernels import KernelLoader


@pytest.fixture(scope="module")
def native() -> KernelLoader:
    loader = KernelLoader()
    if not loader.native_available():
        pytest.fail(f"native kernels did not build: {loader.unavailable_reason}")
    return loader


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x.double(), w.double())


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k"), [(1, 16), (7, 32), (256, 768), (2048, 768), (768, 2048)])
def test_matches_a_float64_reference_within_bfloat16_rounding(
    native: KernelLoader, m: int, n: int, k: int
) -> None:
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    y = native.load().skinny_linear(x, w)
    want = reference(x, w)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    # One bfloat16 rounding of the float32 sum: relative 2^-8, plus float32 accumulation error.
    tol = want.abs() * 2.0**-8 + 1e-4 * k**0.5
    assert ((y.double() - want).abs() <= tol).all()
    # And as close to the reference as torch's own kernel is, up to one bfloat16 ulp.
    torch_err = (F.linear(x, w).double() - want).abs().max()
    assert (y.double() - want).abs().max() <= torch_err + want.abs().max() * 2.0**-7


def test_rounds_to_nearest_and_keeps_special_values(native: KernelLoader) -> None:
    x = torch.ones(1, 16, dtype=torch.bfloat16)
    w = torch.zeros(4, 16, dtype=torch.bfloat16)
    w[0, 0] = float("nan")
    w[1, 0] = float("inf")
    w[2, 0] = 1.0 + 2.0**-7  # representable; 16 of them sum to a value needing rounding
    w[2, 1:] = 1.0 + 2.0**-7
    w[3, 0] = -3.0
    y = native.load().skinny_linear(x, w)
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
    real = module.skinny_linear

    class Spy:
        max_skinny_rows = module.max_skinny_rows

        def skinny_linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            calls.append(tuple(x.shape))
            return real(x, weight)

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
