"""Tests for the batch-invariant linear (csrc/invariant_linear.cpp): close to torch's linear, and
each output row bitwise the same whatever the other rows, their number and the thread count; and
for the other per-row ops of the forward, which must be invariant the same way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from zerolayer.common.generation import SamplingParams
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import rms_norm
from zerolayer.scheduler.model.sampler import Sampler

DTYPES = (torch.bfloat16, torch.float32)


@pytest.fixture(scope="module")
def native() -> KernelLoader:
    loader = KernelLoader(batch_invariant=True)
    if not loader.native_available():
        pytest.fail(f"native kernels did not build: {loader.unavailable_reason}")
    return loader


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def make_inputs(m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype)
    return x, w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(1, 1, 1), (1, 7, 5), (3, 37, 100), (5, 3, 17), (6, 384, 128), (33, 768, 2048), (70, 96, 48)],
)
def test_matches_a_float64_reference(
    native: KernelLoader, dtype: torch.dtype, m: int, n: int, k: int
) -> None:
    x, w = make_inputs(m, n, k, dtype)
    y = native.load().invariant_linear(x, w)
    want = F.linear(x.double(), w.double())
    assert y.dtype == dtype and y.shape == (m, n)
    # One rounding to the output dtype, plus float32 accumulation error over K.
    rounding = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-23
    tol = want.abs() * rounding + 1e-6 * k
    assert ((y.double() - want).abs() <= tol).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), [(2048, 768), (96, 100)])
def test_each_row_is_the_same_for_any_number_of_rows_and_threads(
    native: KernelLoader, threads: None, dtype: torch.dtype, n: int, k: int
) -> None:
    x, w = make_inputs(200, n, k, dtype)
    module = native.load()
    torch.set_num_threads(1)
    alone = torch.cat([module.invariant_linear(x[i : i + 1], w) for i in range(200)])
    for num_threads in (1, 2):
        torch.set_num_threads(num_threads)
        for m in [*range(1, 40), 63, 64, 65, 127, 200]:
            assert torch.equal(module.invariant_linear(x[:m], w), alone[:m]), (num_threads, m)


def test_empty_inputs(native: KernelLoader) -> None:
    module = native.load()
    x, w = make_inputs(3, 8, 32, torch.bfloat16)
    assert module.invariant_linear(x[:0], w).shape == (0, 8)
    assert module.invariant_linear(x, w[:0]).shape == (3, 0)


def test_mismatched_inputs_raise(native: KernelLoader) -> None:
    module = native.load()
    x, w = make_inputs(2, 8, 32, torch.bfloat16)
    with pytest.raises(RuntimeError, match="both bfloat16 or both float32"):
        module.invariant_linear(x, w.float())
    with pytest.raises(RuntimeError, match="both bfloat16 or both float32"):
        module.invariant_linear(x.half(), w.half())
    with pytest.raises(RuntimeError, match="columns"):
        module.invariant_linear(x[:, :16], w)


def test_loader_routes_every_batch_size_to_the_invariant_kernel(native: KernelLoader) -> None:
    module = native.load()
    for dtype in DTYPES:
        x, w = make_inputs(40, 64, 48, dtype)
        assert torch.equal(native.linear(x, w), module.invariant_linear(x, w))
    plain = KernelLoader()
    x, w = make_inputs(40, 64, 48, torch.bfloat16)
    assert torch.equal(plain.linear(x, w), F.linear(x, w))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_other_per_row_ops_are_invariant(threads: None, dtype: torch.dtype) -> None:
    """rms_norm, silu * mul and the float cast of logits, torch's CPU kernels, for M from 1 to
    600 and 1 or 2 threads (a reduction over the last dim could split a row differently when
    there are few rows)."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(600, 768, generator=gen) * 3).to(dtype)
    weight = torch.randn(768, generator=gen).to(dtype)
    logits = torch.randn(64, 32000, generator=gen).to(dtype)
    torch.set_num_threads(1)
    norm = torch.cat([rms_norm(x[i : i + 1], weight, 1e-5) for i in range(600)])
    mlp = torch.cat([F.silu(x[i : i + 1]) * x[i : i + 1] for i in range(600)])
    probs = torch.cat([logits[i : i + 1].float().softmax(-1) for i in range(64)])
    for num_threads in (1, 2):
        torch.set_num_threads(num_threads)
        for m in [1, 2, 3, 5, 8, 17, 33, 64, 100, 257, 600]:
            assert torch.equal(rms_norm(x[:m], weight, 1e-5), norm[:m]), (num_threads, m)
            assert torch.equal(F.silu(x[:m]) * x[:m], mlp[:m]), (num_threads, m)
        for m in [1, 2, 5, 33, 64]:
            assert torch.equal(logits[:m].float().softmax(-1), probs[:m]), (num_threads, m)


def test_the_sampler_draws_a_row_alone_as_in_a_batch(threads: None) -> None:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(40, 32000, generator=gen).to(torch.bfloat16).float()
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(40)]
    seeds, positions = list(range(40)), [100 + i for i in range(40)]
    torch.set_num_threads(1)
    sampler = Sampler()
    alone = [
        sampler(logits[i : i + 1], params[i : i + 1], seeds[i : i + 1], positions[i : i + 1])[0]
        for i in range(40)
    ]
    for num_threads in (1, 2):
        torch.set_num_threads(num_threads)
        assert sampler(logits, params, seeds, positions) == alone
