"""Tests for the native elementwise steps of a layer (csrc/elementwise.cpp) against the torch
expressions they replace, and for when LayerOps takes them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zerolayer.bench.logit_agreement import chunked_logits
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.scheduler.model import llama
from zerolayer.scheduler.model.gemma import gemma_rms_norm
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.layer_ops import LayerOps, rms_norm
from zerolayer.scheduler.model.rope import apply_rotary

BFLOAT16_PRESET = DummyPreset(128, 256, 2, 4, 2, 259, dtype="bfloat16")


def assert_one_ulp_at_most(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """bfloat16 results equal torch's but where the float32 sum of squares, added in another
    order, lands across a rounding boundary: one unit in the last place, in few values."""
    assert actual.dtype == expected.dtype == torch.bfloat16
    differ = actual != expected
    assert differ.sum().item() <= max(1, expected.numel() // 10_000), differ.sum().item()
    a = actual[differ].view(torch.int16).int()
    e = expected[differ].view(torch.int16).int()
    assert ((a - e).abs() <= 1).all()


@pytest.mark.parametrize("rows", [1, 3, 200])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_equals_torchs(native: KernelLoader, rows: int, weight_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 768, generator=gen) * 3).to(torch.bfloat16)
    # a float32 norm weight of a bfloat16 model is rounded to bfloat16 first, as in torch
    weight = torch.randn(768, generator=gen).to(weight_dtype)
    assert_one_ulp_at_most(native.load().rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5))


def test_rms_norm_of_heads_normalizes_the_last_dim(native: KernelLoader) -> None:
    """Qwen3's q and k norms: [T, heads, D] with a [D] weight."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(5, 8, 32, generator=gen).to(torch.bfloat16)
    weight = torch.randn(32, generator=gen).to(torch.bfloat16)
    assert_one_ulp_at_most(native.load().rms_norm(q, weight, 1e-6), rms_norm(q, weight, 1e-6))


@pytest.mark.parametrize("rows", [1, 4, 130])
def test_add_rms_norm_is_the_rounded_sum_and_its_norm(native: KernelLoader, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    h = torch.randn(rows, 512, generator=gen).to(torch.bfloat16)
    d = torch.randn(rows, 512, generator=gen).to(torch.bfloat16)
    weight = torch.randn(512, generator=gen).to(torch.bfloat16)
    s, y = native.load().add_rms_norm(h, d, weight, 1e-5)
    assert torch.equal(s, h + d)
    assert_one_ulp_at_most(y, rms_norm(h + d, weight, 1e-5))


@pytest.mark.parametrize(("tokens", "heads", "dim"), [(1, 12, 64), (7, 4, 128), (100, 2, 32)])
def test_rotary_equals_apply_rotary(
    native: KernelLoader, tokens: int, heads: int, dim: int
) -> None:
    gen = torch.Generator().manual_seed(tokens + heads + dim)
    x = torch.randn(tokens, heads, dim, generator=gen).to(torch.bfloat16)
    cos = torch.randn(tokens, 1, dim, generator=gen).to(torch.bfloat16)
    sin = torch.randn(tokens, 1, dim, generator=gen).to(torch.bfloat16)
    assert torch.equal(native.load().rotary(x, cos, sin), apply_rotary(x, cos, sin))


def test_kernels_refuse_what_they_do_not_compute(native: KernelLoader) -> None:
    module = native.load()
    with pytest.raises(RuntimeError, match="bfloat16 x"):
        module.rms_norm(torch.zeros(2, 16), torch.ones(16), 1e-5)
    with pytest.raises(RuntimeError, match="weight \\[16\\]"):
        module.rms_norm(torch.zeros(2, 16, dtype=torch.bfloat16), torch.ones(8), 1e-5)
    with pytest.raises(RuntimeError, match="shape and dtype"):
        h = torch.zeros(2, 16, dtype=torch.bfloat16)
        module.add_rms_norm(h, torch.zeros(3, 16, dtype=torch.bfloat16), torch.ones(16), 1e-5)
    with pytest.raises(RuntimeError, match="bfloat16 or float32 weight"):
        module.rms_norm(torch.zeros(2, 16, dtype=torch.bfloat16), torch.ones(16).half(), 1e-5)
    with pytest.raises(RuntimeError, match="even head dim"):
        x = torch.zeros(1, 1, 15, dtype=torch.bfloat16)
        module.rotary(x, x, x)


class Recording:
    """A native module that records which kernels LayerOps calls (and computes nothing)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        def kernel(*args):
            self.calls.append(name)
            return (args[0], args[0]) if name == "add_rms_norm" else args[0]

        return kernel


def test_layer_ops_take_the_native_path_only_for_bfloat16_cpu_llama_norms() -> None:
    module = Recording()
    ops = LayerOps(rms_norm, module)  # type: ignore[arg-type]
    x16, w = torch.zeros(1, 8, dtype=torch.bfloat16), torch.ones(8)
    ops.model_norm(x16, w, 1e-5)
    ops.add_norm(x16, x16, w, 1e-5)
    ops.rotary(x16.view(1, 2, 4), x16[:, :4].view(1, 1, 4), x16[:, :4].view(1, 1, 4))
    assert module.calls == ["rms_norm", "add_rms_norm", "rotary"]
    # float32 models, non-contiguous rows and Gemma's norm keep torch's ops
    x32 = torch.zeros(1, 8)
    ops.model_norm(x32, w, 1e-5)
    ops.add_norm(x32, x32, w, 1e-5)
    ops.rotary(x32.view(1, 2, 4), x32[:, :4].view(1, 1, 4), x32[:, :4].view(1, 1, 4))
    ops.model_norm(torch.zeros(8, 2, dtype=torch.bfloat16).t(), torch.ones(8), 1e-5)
    gemma = LayerOps(gemma_rms_norm, module)  # type: ignore[arg-type]
    gemma.model_norm(x16, w, 1e-5)
    _, y = gemma.add_norm(x16, x16, w, 1e-5)
    assert torch.equal(y, gemma_rms_norm(x16 + x16, w, 1e-5))
    assert module.calls == ["rms_norm", "add_rms_norm", "rotary"]
    # without the native module everything is torch
    plain = LayerOps(rms_norm, None)
    assert torch.equal(plain.add_norm(x16, None, w, 1e-5)[1], rms_norm(x16, w, 1e-5))


def test_the_forward_with_native_layer_ops_equals_the_forward_without(
    native: KernelLoader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same greedy ids and logits within a bfloat16 rounding, for prefill (8 tokens a step)
    and decode (one a step) of a bfloat16 model: the fused add + norm and the native RoPE change
    the call count, not the arithmetic."""
    model_dir = write_dummy_model(tmp_path / "bf16", BFLOAT16_PRESET, seed=5)
    tokens = [1, *range(40, 70)]
    with_native = [chunked_logits(model_dir, tokens, native, step) for step in (8, 1)]
    calls: list[str] = []

    class TorchOnly(LayerOps):
        def __init__(self, norm, native_module) -> None:
            calls.append("torch only")
            super().__init__(norm, None)

    monkeypatch.setattr(llama, "LayerOps", TorchOnly)
    without = [chunked_logits(model_dir, tokens, native, step) for step in (8, 1)]
    assert calls, "the forward did not build its LayerOps through llama.LayerOps"
    for a, b in zip(with_native, without, strict=True):
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        torch.testing.assert_close(a, b, atol=2e-2, rtol=0)
