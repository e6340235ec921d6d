"""GGUF blocks dequantized by the native kernels (csrc/gguf_dequant.h, every instruction set) and
by the torch reference (zerolayer/scheduler/model/gguf/dequantize.py), bit-exact against gguf-py's
``gguf.quants.dequantize`` on random blocks of every type."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from factories import make_gguf_weight

from zerolayer.checkpoints.gguf.tensor_types import SERVED_TYPES
from zerolayer.scheduler.model.gguf.dequantize import dequantize_reference
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.kernels import KernelLoader

ISAS = ("avx512vnni", "avx2", "portable")


def gguf_values(weight: QuantWeight) -> torch.Tensor:
    """gguf-py's dequantization of the weight's bytes, float32 [N, K]."""
    qtype = gguf.GGMLQuantizationType[weight.qtype.name]
    values = gguf.quants.dequantize(weight.data.numpy(), qtype)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(weight.shape)


def bits(t: torch.Tensor) -> torch.Tensor:
    """float32 values as their bit patterns (NaN payloads and signed zeros compared too)."""
    return t.contiguous().view(torch.int32)


def native_or_skip(native: KernelLoader, weight: QuantWeight, isa: str, **kwargs: object):
    try:
        return native.load().gguf_dequantize(weight, isa=isa, **kwargs)
    except RuntimeError as error:
        assert "does not run on this CPU" in str(error)
        pytest.skip(f"{isa}: not on this CPU")


@pytest.mark.parametrize("name", list(SERVED_TYPES))
def test_reference_is_bit_exact(name: str) -> None:
    weight = make_gguf_weight(name, 9, 768, seed=1, scale=3.0)
    assert torch.equal(bits(dequantize_reference(weight)), bits(gguf_values(weight)))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", list(SERVED_TYPES))
def test_native_is_bit_exact(native: KernelLoader, name: str, isa: str) -> None:
    # 1280 values: K-quants' five super-blocks; two chunks of the bfloat16 path's 1024.
    weight = make_gguf_weight(name, 11, 1280, seed=2, scale=3.0)
    want = gguf_values(weight)
    assert torch.equal(bits(native_or_skip(native, weight, isa)), bits(want))
    # bfloat16: the exact value rounded once, to nearest even (as torch rounds)
    as_bf16 = native_or_skip(native, weight, isa, dtype=torch.bfloat16)
    assert as_bf16.dtype == torch.bfloat16
    assert torch.equal(as_bf16, want.to(torch.bfloat16))
    ids = torch.tensor([10, 0, 3, 3])
    rows = native_or_skip(native, weight, isa, ids=ids)
    assert torch.equal(bits(rows), bits(want[ids]))
    assert torch.equal(bits(dequantize_reference(weight, ids=ids)), bits(want[ids]))


def test_tiny_and_huge_scales_stay_exact(native: KernelLoader) -> None:
    # float16 subnormal and large scales: products that round in float32
    for scale in (1e-6, 3e3):
        for name in ("Q4_1", "Q4_K", "Q6_K"):
            weight = make_gguf_weight(name, 3, 512, seed=3, scale=scale)
            want = bits(gguf_values(weight))
            assert torch.equal(bits(native.load().gguf_dequantize(weight)), want)
            assert torch.equal(bits(dequantize_reference(weight)), want)


def test_bad_inputs_are_refused_with_their_reason(native: KernelLoader) -> None:
    module = native.load()
    weight = make_gguf_weight("Q4_K", 4, 512)
    with pytest.raises(RuntimeError, match=r"row id 4 is not in \[0, 4\)"):
        module.gguf_dequantize(weight, ids=torch.tensor([0, 4]))
    with pytest.raises(RuntimeError, match="float32 or bfloat16 out"):
        module.gguf_dequantize(weight, torch.float16)
    short = QuantWeight(weight.data[:, :-1], weight.qtype, weight.shape)
    with pytest.raises(RuntimeError, match=r"Q4_K \[4, 512\] is uint8 \[4, 288\]"):
        module.gguf_dequantize(short)
    with pytest.raises(ValueError, match="blk.0: rows of 100 bytes are not whole Q4_K blocks"):
        QuantWeight.of(torch.zeros(2, 100, dtype=torch.uint8), "Q4_K", "blk.0")
    with pytest.raises(ValueError, match="blk.1: GGUF type 'Q2_K' is not supported"):
        QuantWeight.of(torch.zeros(2, 84, dtype=torch.uint8), "Q2_K", "blk.1")
    with pytest.raises(ValueError, match="w: F16 expected, got torch.float32"):
        QuantWeight.of(torch.zeros(2, 32), "F16", "w")
    with pytest.raises(RuntimeError, match="unknown ISA sse9"):
        module.gguf_dequantize(weight, isa="sse9")
