"""Tests for the int8 linear (csrc/int8_linear.cpp) against its torch reference and against
F.linear of the dequantized weight, and for the paths KernelLoader.int8_linear takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zerolayer.checkpoints.int8_format import dequantize_weight, quantize_weight
from zerolayer.scheduler.model import int8_linear as int8
from zerolayer.scheduler.model.int8_linear import (
    Int8Weight,
    int8_linear_chunked,
    int8_linear_reference,
    quantize_activations,
)
from zerolayer.scheduler.model.kernels import KernelLoader


@pytest.fixture(scope="module")
def native() -> KernelLoader:
    loader = KernelLoader()
    assert loader.native_available(), f"native kernels did not build: {loader.unavailable_reason}"
    return loader


def make_weight(n: int, k: int, group_size: int, seed: int) -> tuple[torch.Tensor, Int8Weight]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) / k**0.5
    return w, Int8Weight(*quantize_weight(w, group_size))


def make_x(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def relative_error(y: torch.Tensor, want: torch.Tensor) -> float:
    return float((y.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("n", "k", "g"), [(1, 32, 32), (7, 64, 32), (256, 768, 32), (768, 2048, 32), (33, 128, 64)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference_and_dequantized_linear(
    native: KernelLoader, m: int, n: int, k: int, g: int, dtype: torch.dtype
) -> None:
    w, weight = make_weight(n, k, g, seed=n + k + g)
    x = make_x(m, k, dtype, seed=m)
    y = native.load().int8_linear(x, weight.qweight, weight.scales)
    assert y.dtype == dtype and y.shape == (m, n)
    want = int8_linear_reference(x, weight)
    # Same integer group sums; only the float32 order of the group sums and one rounding differ.
    eps = 2.0**-7 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(y.float(), want.float(), rtol=eps, atol=eps)
    # Quantizing x and w to 8 bits each costs well under 1% of the product.
    dequantized = F.linear(x.double(), dequantize_weight(weight.qweight, weight.scales).double())
    assert relative_error(y, dequantized) < 0.02
    assert relative_error(y, F.linear(x.double(), w.double())) < 0.03


def test_portable_group_sizes_use_the_same_arithmetic(native: KernelLoader) -> None:
    # G = 16 is no multiple of 32: the portable loop, not VNNI.
    assert native.load().int8_linear_isa(16) == "portable"
    _, weight = make_weight(40, 64, 16, seed=1)
    x = make_x(2, 64, torch.float32, seed=2)
    y = native.load().int8_linear(x, weight.qweight, weight.scales)
    assert torch.allclose(y, int8_linear_reference(x, weight), rtol=1e-5, atol=1e-5)


def test_uses_vnni_where_the_cpu_has_it_else_avx2(
    native: KernelLoader, kernel_cpu_flags: frozenset[str]
) -> None:
    isa = native.load().int8_linear_isa(32)
    if "avx512_vnni" in kernel_cpu_flags:
        assert isa == "avx512vnni"
    elif "avx_vnni" in kernel_cpu_flags:
        assert isa == "avxvnni"
    elif "avx2" in kernel_cpu_flags:
        assert isa == "avx2"
    else:
        assert isa == "portable"


def test_exact_on_values_the_format_represents(native: KernelLoader) -> None:
    # Weights and x that are already integers with unit scales: every sum is exact.
    qweight = torch.tensor([[127, -127] + [0] * 30, [1] * 32, [-3] * 32], dtype=torch.int8)
    weight = Int8Weight(qweight, torch.tensor([[0.5], [2.0], [0.0]]))
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 127.0, -127.0
    y = native.load().int8_linear(x, weight.qweight, weight.scales)
    assert y.tolist() == [[127.0 * 127 * 2 * 0.5, 0.0, 0.0]]


@pytest.mark.parametrize("m", [1, 5, 64])
def test_chunked_path_equals_linear_of_the_dequantized_weight(
    monkeypatch: pytest.MonkeyPatch, m: int
) -> None:
    monkeypatch.setattr(int8, "CHUNK_ELEMENTS", 7 * 64)  # several blocks, the last one short
    _, weight = make_weight(30, 64, 32, seed=3)
    x = make_x(m, 64, torch.float32, seed=4)
    want = F.linear(x, dequantize_weight(weight.qweight, weight.scales))
    assert torch.allclose(int8_linear_chunked(x, weight), want, rtol=1e-6, atol=1e-6)


def test_kernel_loader_routes_decode_to_the_kernel_and_prefill_to_the_chunks(
    native: KernelLoader,
) -> None:
    _, weight = make_weight(64, 128, 32, seed=5)
    decode, prefill = make_x(4, 128, torch.bfloat16, 6), make_x(5, 128, torch.bfloat16, 7)
    kernel = native.load().int8_linear(decode, *weight.tensors())
    assert torch.equal(native.linear(decode, weight), kernel)
    assert torch.equal(native.linear(prefill, weight), int8_linear_chunked(prefill, weight))
    off = KernelLoader(enabled=False)
    assert torch.equal(off.linear(decode, weight), int8_linear_chunked(decode, weight))


def test_quantize_activations_is_q8_0() -> None:
    x = torch.tensor([[1.0, -2.0, 0.5, 0.25], [0.0, 0.0, 0.0, 0.0]])
    q, scales = quantize_activations(x, 4)
    assert scales.tolist() == [[torch.tensor(2.0 / 127).item()], [0.0]]
    assert q.tolist() == [[64.0, -127.0, 32.0, 16.0], [0.0, 0.0, 0.0, 0.0]]


def test_rejects_what_it_does_not_handle(native: KernelLoader) -> None:
    module = native.load()
    _, weight = make_weight(8, 64, 32, seed=8)
    with pytest.raises(RuntimeError, match="rows of x"):
        module.int8_linear(make_x(5, 64, torch.float32, 9), *weight.tensors())
    with pytest.raises(RuntimeError, match="int8 w"):
        module.int8_linear(make_x(1, 64, torch.float32, 9), weight.qweight.float(), weight.scales)
    with pytest.raises(RuntimeError, match="columns"):
        module.int8_linear(make_x(1, 32, torch.float32, 9), *weight.tensors())


def test_batch_invariant_rows_do_not_depend_on_the_batch() -> None:
    invariant = KernelLoader(batch_invariant=True)
    _, weight = make_weight(40, 128, 32, seed=10)
    x = make_x(9, 128, torch.bfloat16, seed=11)
    whole = invariant.linear(x, weight)
    for m in (1, 2, 4, 5):  # either side of the decode kernel's 4 rows
        assert torch.equal(invariant.linear(x[:m], weight), whole[:m])
    want = F.linear(x.float(), dequantize_weight(weight.qweight, weight.scales)).to(x.dtype)
    assert relative_error(whole, want) < 0.01


ISAS = ("avx512vnni", "avx512vnni256", "avxvnni", "avx2", "portable")


def with_isa(native: KernelLoader, x: torch.Tensor, weight: Int8Weight, isa: str) -> torch.Tensor:
    """The kernel isa's result, or the test skipped where this CPU does not run it."""
    try:
        return native.load().int8_linear_with_isa(x, *weight.tensors(), isa)
    except RuntimeError as error:
        assert "does not run on this CPU" in str(error)
        pytest.skip(f"{isa}: not on this CPU")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("n", "k", "g"), [(1, 32, 32), (9, 96, 32), (70, 2048, 32), (33, 128, 64), (13, 192, 96)]
)
def test_every_kernel_this_cpu_runs_matches_the_reference(
    native: KernelLoader, isa: str, m: int, n: int, k: int, g: int
) -> None:
    # K = 96: the 512-bit kernel's last 64-byte chunk is half empty; G = 64 and 96: no pairs of
    # groups of 32 per chunk; 70 rows: blocks of several rows and a remainder.
    _, weight = make_weight(n, k, g, seed=n * k + g)
    x = make_x(m, k, torch.float32, seed=m + k)
    y = with_isa(native, x, weight, isa)
    assert torch.allclose(y, int8_linear_reference(x, weight), rtol=1e-5, atol=1e-5)


def test_the_best_kernel_is_the_one_int8_linear_isa_names(native: KernelLoader) -> None:
    module = native.load()
    _, weight = make_weight(40, 256, 32, seed=12)
    x = make_x(3, 256, torch.bfloat16, seed=13)
    isa = module.int8_linear_isa(32)
    assert torch.equal(
        module.int8_linear(x, *weight.tensors()),
        module.int8_linear_with_isa(x, *weight.tensors(), isa),
    )
    with pytest.raises(RuntimeError, match="unknown ISA"):
        module.int8_linear_with_isa(x, *weight.tensors(), "sse9")
    if isa != "portable":  # the portable loop takes any group size
        with pytest.raises(RuntimeError, match="group size 16"):
            module.int8_linear_with_isa(x[:, :64], *make_weight(4, 64, 16, 1)[1].tensors(), isa)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("k", "g", "ns"),
    [
        (768, 32, (768, 256, 256)),  # q, k, v of the small preset: k and v under one grain
        (768, 32, (2048, 2048)),  # gate, up
        (96, 32, (7, 1, 33)),  # odd N, K an odd multiple of 32
        (128, 64, (5, 3)),
    ],
)
def test_multi_equals_one_call_per_weight(
    native: KernelLoader, m: int, dtype: torch.dtype, k: int, g: int, ns: tuple[int, ...]
) -> None:
    module = native.load()
    weights = [make_weight(n, k, g, seed=n + i)[1] for i, n in enumerate(ns)]
    x = make_x(m, k, dtype, seed=m)
    ys = module.int8_linear_multi(x, [(w.qweight, w.scales) for w in weights])
    assert len(ys) == len(weights)
    for y, weight in zip(ys, weights, strict=True):
        assert y.dtype == dtype and y.shape == (m, weight.qweight.shape[0])
        assert torch.equal(y, module.int8_linear(x, weight.qweight, weight.scales))


def test_multi_rejects_what_it_does_not_handle(native: KernelLoader) -> None:
    module = native.load()
    x = make_x(1, 64, torch.float32, 9)
    with pytest.raises(RuntimeError, match="at least one weight"):
        module.int8_linear_multi(x, [])
    with pytest.raises(RuntimeError, match="one group size"):
        module.int8_linear_multi(
            x, [make_weight(8, 64, 32, 1)[1].tensors(), make_weight(8, 64, 64, 2)[1].tensors()]
        )
    with pytest.raises(RuntimeError, match="columns"):
        module.int8_linear_multi(
            x, [make_weight(8, 64, 32, 1)[1].tensors(), make_weight(8, 32, 32, 2)[1].tensors()]
        )


class MultiCalls:
    """Counts the calls of a module's int8_linear_multi, then runs it."""

    def __init__(self, multi: object) -> None:
        self.multi = multi
        self.calls = 0

    def __call__(self, *args: object) -> list[torch.Tensor]:
        self.calls += 1
        return self.multi(*args)  # type: ignore[operator]


def test_kernel_loader_linears_sends_int8_decode_to_one_multi_call(
    native: KernelLoader, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = native.load()
    spy = MultiCalls(module.int8_linear_multi)
    monkeypatch.setattr(module, "int8_linear_multi", spy)
    weights = [make_weight(n, 128, 32, seed=n)[1] for n in (64, 16, 16)]
    decode, prefill = make_x(4, 128, torch.bfloat16, 6), make_x(5, 128, torch.bfloat16, 7)
    ys = native.linears(decode, weights)
    assert spy.calls == 1
    for y, weight in zip(ys, weights, strict=True):
        assert torch.equal(y, native.linear(decode, weight))
    # Prefill, a mix with a bfloat16 weight and mixed group sizes go one by one.
    native.linears(prefill, weights)
    native.linears(decode, [weights[0], torch.randn(8, 128, dtype=torch.bfloat16)])
    native.linears(decode, [weights[0], make_weight(8, 128, 64, seed=1)[1]])
    assert spy.calls == 1
    # --batch-invariant keeps every int8 call on the chunked path.
    invariant = KernelLoader(batch_invariant=True)
    invariant_module = invariant.load()
    invariant_spy = MultiCalls(invariant_module.int8_linear_multi)
    monkeypatch.setattr(invariant_module, "int8_linear_multi", invariant_spy)
    for y, weight in zip(invariant.linears(decode, weights), weights, strict=True):
        assert torch.equal(y, invariant.linear(decode, weight))
    assert invariant_spy.calls == 0


@pytest.mark.parametrize("isa", ISAS)
def test_bfloat16_x_is_its_float32_value_and_the_result_is_rounded_once(
    native: KernelLoader, isa: str
) -> None:
    # The kernel widens bfloat16 x itself and stores bfloat16 y itself (round to nearest even):
    # the same as quantizing x.float() and rounding the float32 result with torch.
    _, weight = make_weight(300, 768, 32, seed=14)
    x = make_x(2, 768, torch.bfloat16, seed=15)
    y = with_isa(native, x, weight, isa)
    y32 = with_isa(native, x.float(), weight, isa)
    assert y.dtype == torch.bfloat16 and y32.dtype == torch.float32
    assert torch.equal(y, y32.to(torch.bfloat16))
