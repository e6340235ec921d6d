"""The GGUF linear (csrc/gguf_linear.cpp, every instruction set) against dequantize + float matmul
on random blocks and random x, and the paths KernelLoader.quant_linear takes.

Tolerances, per output y_i = sum_j w_ij x_j (all in float64 from the dequantized weight):
- bfloat16 x is quantized per block (Q8_0 or Q8_K, as the kernel does: reference.quantized_x);
  against x's quantized value x^ the kernel's integer block sums are exact and only float32
  scaling and summation round: |y - w.x^| <= 1e-5 sum_j |w_ij x^_j|, plus half a bfloat16 ulp of
  the output (2^-8 |y|).
- against x itself, each x_j moved by at most half its block's step d_x: |w.x^ - w.x| <= sum_j
  |w_ij| d_x(j) / 2.
- float32 x multiplies the exactly dequantized weights: |y - w.x| <= 1e-6 sum_j |w_ij x_j|.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from factories import make_gguf_weight

from zerolayer.checkpoints.gguf.tensor_types import SERVED_TYPES
from zerolayer.scheduler.model.gguf import linear as gguf_linear_module
from zerolayer.scheduler.model.gguf.dequantize import dequantize_reference
from zerolayer.scheduler.model.gguf.linear import quant_linear_chunked
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.gguf.reference import quant_linear_reference, quantized_x
from zerolayer.scheduler.model.kernels import KernelLoader

ISAS = ("avx512vnni", "avx2", "portable")
QUANTIZED = [name for name, t in SERVED_TYPES.items() if t.quantized]


def make_x(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def with_isa(native: KernelLoader, x: torch.Tensor, weight: QuantWeight, isa: str) -> torch.Tensor:
    """The kernels isa's result, or the test skipped where this CPU does not run them."""
    try:
        return native.load().gguf_linear(x, weight, isa=isa)
    except RuntimeError as error:
        assert "does not run on this CPU" in str(error)
        pytest.skip(f"{isa}: not on this CPU")


def check_against_float(y: torch.Tensor, x: torch.Tensor, weight: QuantWeight) -> None:
    """Asserts the tolerances of the module docstring."""
    assert y.dtype == x.dtype and y.shape == (x.shape[0], weight.shape[0])
    w = dequantize_reference(weight).double()
    exact = x.double() @ w.T
    if x.dtype == torch.float32:
        bound = 1e-6 * (x.double().abs() @ w.abs().T)
        assert ((y.double() - exact).abs() <= bound).all()
        return
    x_hat, step = quantized_x(x, weight.qtype.name)
    want = quant_linear_reference(x, weight)
    bound = 1e-5 * (x_hat.double().abs() @ w.abs().T) + 2.0**-8 * want.abs()
    assert ((y.double() - want).abs() <= bound).all()
    moved = step.double() / 2 @ w.abs().T
    assert ((want - exact).abs() <= moved + 1e-12).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("name", list(SERVED_TYPES))
def test_every_type_and_isa_matches_the_float_product(
    native: KernelLoader, name: str, m: int, dtype: torch.dtype, isa: str
) -> None:
    # 37 rows: no multiple of the 16-row tile of M > 4; K = 512: two super-blocks, 16 blocks
    weight = make_gguf_weight(name, 37, 512, seed=m)
    x = make_x(m, 512, dtype, seed=m + 100)
    check_against_float(with_isa(native, x, weight, isa), x, weight)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    ("name", "n", "k"),
    [
        ("Q4_0", 1, 32),
        ("Q5_1", 70, 96),  # an odd number of blocks
        ("Q8_0", 33, 2048),
        ("Q4_K", 1, 256),
        ("Q6_K", 19, 1280),
        ("F16", 5, 40),  # float types: any K, a tail shorter than 16
        ("F32", 3, 1000),  # two chunks of 512, the last short
        ("BF16", 2, 8),
    ],
)
def test_odd_shapes(native: KernelLoader, isa: str, name: str, n: int, k: int) -> None:
    weight = make_gguf_weight(name, n, k, seed=n + k)
    for dtype in (torch.bfloat16, torch.float32):
        for m in (1, 4, 7):
            x = make_x(m, k, dtype, seed=m)
            check_against_float(with_isa(native, x, weight, isa), x, weight)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K", "F16"])
def test_large_m_tiles_the_rows(native: KernelLoader, name: str) -> None:
    weight = make_gguf_weight(name, 50, 512, seed=5)
    for dtype in (torch.bfloat16, torch.float32):
        x = make_x(70, 512, dtype, seed=6)
        y = native.load().gguf_linear(x, weight)
        check_against_float(y, x, weight)
        # a row's result does not depend on the others: the same alone or in a batch
        assert torch.equal(native.load().gguf_linear(x[13:14], weight), y[13:14])


def test_every_isa_gives_the_same_integer_sums(native: KernelLoader) -> None:
    # Exact integer block sums: the instruction sets differ only in float32 summation order.
    module = native.load()
    for name in QUANTIZED:
        weight = make_gguf_weight(name, 16, 768, seed=7)
        x = make_x(3, 768, torch.bfloat16, seed=8).float().to(torch.bfloat16)
        want = quant_linear_reference(x, weight)
        ys = [with_isa(native, x, weight, isa).double() for isa in ISAS]
        for y in ys:
            assert torch.allclose(y, ys[0], rtol=2**-7, atol=1e-6)
        assert torch.allclose(ys[0], want, rtol=2**-7, atol=1e-6)
    assert module.gguf_isa in ISAS


def test_exact_on_values_the_formats_represent(native: KernelLoader) -> None:
    # Q8_0 weights of scale 1 and x of one nonzero per block: every product is exact.
    block = torch.zeros(34, dtype=torch.uint8)
    block[:2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    block[2:] = torch.arange(-16, 16, dtype=torch.int8).view(torch.uint8)
    weight = QuantWeight.of(block.reshape(1, 34), "Q8_0")
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    x[0, 31] = 2.0  # d_x = 2 / 127, q = 127: back to exactly 2 * 15
    for isa in ISAS:
        assert with_isa(native, x, weight, isa).tolist() == [[30.0]]
        assert with_isa(native, x.float(), weight, isa).tolist() == [[30.0]]


def test_multi_equals_one_call_per_weight(native: KernelLoader) -> None:
    # q, k, v of a Q4_K_M file: Q4_K and Q6_K side by side, with a Q8_0 and an F16 one
    module = native.load()
    weights = [
        make_gguf_weight(name, n, 512, seed=i)
        for i, (name, n) in enumerate(
            [("Q4_K", 64), ("Q4_K", 16), ("Q6_K", 16), ("Q8_0", 7), ("F16", 3)]
        )
    ]
    for dtype in (torch.bfloat16, torch.float32):
        for m in (1, 4, 6):
            x = make_x(m, 512, dtype, seed=m)
            ys = module.gguf_linear_multi(x, weights)
            for y, weight in zip(ys, weights, strict=True):
                assert torch.equal(y, module.gguf_linear(x, weight))


def test_bad_inputs_are_refused_with_their_reason(native: KernelLoader) -> None:
    module = native.load()
    weight = make_gguf_weight("Q4_K", 8, 512)
    x = make_x(2, 512, torch.bfloat16, seed=1)
    with pytest.raises(RuntimeError, match="x has 256 columns, the weight 512"):
        module.gguf_linear(x[:, :256], weight)
    short = QuantWeight(weight.data[:, :-2], weight.qtype, weight.shape)
    with pytest.raises(RuntimeError, match=r"Q4_K \[8, 512\] is uint8 \[8, 288\], got"):
        module.gguf_linear(x, short)
    odd = QuantWeight(torch.zeros(8, 54, dtype=torch.uint8), SERVED_TYPES["Q4_0"], (8, 96))
    with pytest.raises(RuntimeError, match="K = 100 is not a multiple of Q4_0's block size"):
        module.gguf_linear(
            make_x(1, 100, torch.float32, 1), QuantWeight(odd.data, odd.qtype, (8, 100))
        )
    with pytest.raises(RuntimeError, match="bfloat16 or float32 x"):
        module.gguf_linear(x.half(), weight)
    with pytest.raises(RuntimeError, match="at least one weight"):
        module.gguf_linear_multi(x, [])
    with pytest.raises(RuntimeError, match="unknown ISA sse9"):
        module.gguf_linear(x, weight, isa="sse9")


class Calls:
    """Counts a callable's calls, then runs it."""

    def __init__(self, f: object) -> None:
        self.f = f
        self.calls = 0

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        return self.f(*args, **kwargs)  # type: ignore[operator]


def test_kernel_loader_routes_by_the_number_of_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    native = KernelLoader()
    module = native.load()
    assert module is not None
    weight = make_gguf_weight("Q4_K", 40, 512, seed=9)
    native.gguf_max_rows[torch.bfloat16] = 32  # as where torch's bfloat16 matmul is fast
    decode = make_x(32, 512, torch.bfloat16, seed=1)
    prefill = make_x(33, 512, torch.bfloat16, seed=2)
    assert torch.equal(native.linear(decode, weight), module.gguf_linear(decode, weight))
    # more rows: native dequantization to bfloat16 blocks, then torch's matmul
    chunked = quant_linear_chunked(prefill, weight, module.gguf_dequantize)
    assert torch.equal(native.linear(prefill, weight), chunked)
    want = F.linear(prefill, dequantize_reference(weight, torch.bfloat16))
    assert torch.equal(chunked, want)
    off = KernelLoader(enabled=False)
    assert torch.equal(
        off.linear(decode, weight), F.linear(decode, dequantize_reference(weight, torch.bfloat16))
    )
    # one multi call for q, k, v; a mix with a plain tensor goes one by one
    spy = Calls(module.gguf_linear_multi)
    monkeypatch.setattr(module, "gguf_linear_multi", spy)
    weights = [weight, make_gguf_weight("Q6_K", 8, 512, seed=3)]
    ys = native.linears(decode, weights)
    assert spy.calls == 1
    for y, w in zip(ys, weights, strict=True):
        assert torch.equal(y, module.gguf_linear(decode, w))
    native.linears(decode, [weight, torch.randn(8, 512, dtype=torch.bfloat16)])
    native.linears(prefill, weights)
    assert spy.calls == 1


def test_chunked_path_equals_linear_of_the_dequantized_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gguf_linear_module, "CHUNK_ELEMENTS", 7 * 512)  # the last block short
    weight = make_gguf_weight("Q5_K", 30, 512, seed=3)
    x = make_x(5, 512, torch.float32, seed=4)
    w = dequantize_reference(weight)
    # torch's float32 matmul may block a 7-row chunk otherwise than the whole matrix
    error = (quant_linear_chunked(x, weight) - F.linear(x, w)).abs()
    assert (error <= 1e-6 * (x.abs() @ w.abs().T)).all()


def test_batch_invariant_rows_do_not_depend_on_the_batch() -> None:
    invariant = KernelLoader(batch_invariant=True)
    weight = make_gguf_weight("Q4_K", 40, 512, seed=10)
    for dtype in (torch.bfloat16, torch.float32):
        rows = invariant.gguf_max_rows[dtype] = 4  # the switch to the chunks within the batch
        x = make_x(2 * rows + 3, 512, dtype, seed=11)
        whole = invariant.linear(x, weight)
        for m in (1, 2, 4, 5, rows + 1):
            assert torch.equal(invariant.linear(x[:m], weight), whole[:m])
