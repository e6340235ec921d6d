"""Linear layers over int8 weights (``zerolayer quantize`` checkpoints), and their references.

A weight is an :class:`Int8Weight`: int8 [N, K] and float32 scales [N, K / G], both views of the
mapped checkpoint (never copied, never dequantized at load). Decode (a few rows of x) runs the
native kernel ``csrc/int8_linear.cpp``, which quantizes x per group (llama.cpp's Q8_0) and sums
int8 products in int32 per group; anything else dequantizes a block of weight rows at a time into
a scratch tensor and multiplies (:func:`int8_linear_chunked`), so no whole dequantized matrix is
held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zerolayer.checkpoints.int8_format import QMAX, dequantize_weight

CHUNK_ELEMENTS = 1 << 20
"""Weights dequantized at a time by :func:`int8_linear_chunked` (4 MiB of float32 scratch)."""


@dataclass(frozen=True)
class Int8Weight:
    """A quantized linear weight: ``qweight`` int8 [N, K], ``scales`` float32 [N, K / G]
    (format: :mod:`zerolayer.checkpoints.int8_format`)."""

    qweight: torch.Tensor
    scales: torch.Tensor

    @property
    def group_size(self) -> int:
        """Weights per scale along K (G)."""
        return self.qweight.shape[1] // self.scales.shape[1]

    @property
    def device(self) -> torch.device:
        """Where the weight is."""
        return self.qweight.device

    def tensors(self) -> list[torch.Tensor]:
        """Its two tensors."""
        return [self.qweight, self.scales]


def quantize_activations(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 quantization of ``x`` [M, K] per group of ``group_size`` along K, exactly as the
    native kernel does it: d = max|x| / 127, q = round(x * (1 / d)) (half to even), in float32.

    Returns:
        (float32 [M, K] holding the int8 values, float32 scales [M, K / group_size]).
    """
    m, k = x.shape
    groups = x.float().reshape(m, k // group_size, group_size)
    scales = groups.abs().amax(dim=-1) / QMAX
    inverse = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
    q = torch.round(groups * inverse.unsqueeze(-1)).clamp_(-QMAX, QMAX)
    return q.reshape(m, k), scales


def int8_linear_reference(x: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
    """What ``csrc/int8_linear.cpp`` computes, in torch: ``x`` [M, K] quantized per group
    (:func:`quantize_activations`), each group's integer dot product (exact in float32 for
    G <= 1024), times both scales, summed over groups in float32.

    Returns:
        [M, N] in the dtype of ``x``.
    """
    g = weight.group_size
    xq, xs = quantize_activations(x, g)
    m, k = xq.shape
    n = weight.qweight.shape[0]
    wq = weight.qweight.float().reshape(n, k // g, g)
    sums = torch.einsum("mgi,ngi->mng", xq.reshape(m, k // g, g), wq)
    y = (sums * xs.unsqueeze(1) * weight.scales.unsqueeze(0)).sum(dim=-1)
    return y.to(x.dtype)


def int8_linear_chunked(
    x: torch.Tensor,
    weight: Int8Weight,
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.linear,
) -> torch.Tensor:
    """``linear(x, dequantize(weight))`` with the weight dequantized (to ``x``'s dtype) a
    block of rows at a time into scratch (prefill, or no native kernel); any M, any device.

    Args:
        linear: the product of ``x`` and a block of rows (``F.linear``, or the batch-invariant
            kernel: each output then depends only on its row of ``x`` and on the weight).

    Returns:
        [M, N] in the dtype of ``x``.
    """
    n, k = weight.qweight.shape
    rows = max(1, CHUNK_ELEMENTS // k)
    if rows >= n:
        return linear(x, dequantize_weight(weight.qweight, weight.scales, x.dtype))
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    for n0 in range(0, n, rows):
        block = dequantize_weight(
            weight.qweight[n0 : n0 + rows], weight.scales[n0 : n0 + rows], x.dtype
        )
        out[:, n0 : n0 + rows] = linear(x, block)
    return out
