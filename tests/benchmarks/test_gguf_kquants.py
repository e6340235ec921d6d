"""The tests' K-quant quantizer (tests/gguf_kquants.py) against gguf-py's dequantizer: every value
comes back within half its sub-block's quantization step."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from benchmarks.llamacpp.gguf_kquants import quantize, quantize_k

QK = gguf.GGMLQuantizationType


def steps(blocks: np.ndarray, type_name: str) -> np.ndarray:
    """Each value's quantization step, [B, 256], read from the blocks' scales."""
    if type_name == "Q6_K":
        d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
        scales = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
        return np.repeat(d * np.abs(scales), 16, axis=1)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    scales, _ = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
    return np.repeat(d * scales.astype(np.float32), 32, axis=1)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K"])
def test_values_come_back_within_half_a_step(type_name: str) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 1024)) * 0.05).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero super-block
    x[1, :32] = 0.3  # a constant sub-block
    x[2] = np.abs(x[2])  # no negative value: no min
    x[3, 256:512] *= 1e-4  # a super-block of tiny values
    blocks = quantize_k(x, type_name)
    assert blocks.shape == (6, 4 * gguf.GGML_QUANT_SIZES[QK[type_name]][1])
    back = gguf.quants.dequantize(blocks, QK[type_name]).reshape(x.shape)
    step = steps(blocks.reshape(-1, blocks.shape[1] // 4), type_name).reshape(x.shape)
    assert (np.abs(back - x) <= step / 2 * (1 + 1e-3) + 1e-7 * np.abs(x)).all()
    assert (back[0, :256] == 0).all()
    # coarser than 8 bits, finer than the range: the error is a few percent of the largest value
    error = np.abs(back - x).max() / np.abs(x).max()
    assert 1e-4 < error < {"Q4_K": 0.06, "Q5_K": 0.03, "Q6_K": 0.015}[type_name]


def test_other_types_go_to_gguf_py_and_bad_shapes_are_refused() -> None:
    x = np.linspace(-1, 1, 2 * 64, dtype=np.float32).reshape(2, 64)
    blocks = quantize(x, "Q8_0")
    assert blocks.dtype == np.uint8 and blocks.shape == (2, 2 * 34)
    assert np.abs(gguf.quants.dequantize(blocks, QK.Q8_0).reshape(x.shape) - x).max() < 0.005
    with pytest.raises(ValueError, match="K = 64 is not a multiple of 256"):
        quantize_k(x, "Q4_K")
    with pytest.raises(ValueError, match="no K-quant quantizer for Q2_K"):
        quantize_k(np.zeros((1, 256), np.float32), "Q2_K")
