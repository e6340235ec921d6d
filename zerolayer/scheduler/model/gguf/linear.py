"""The linear layer over a :class:`QuantWeight` without native kernels, or for many rows of x: a
block of weight rows dequantized at a time into scratch, then torch's matmul, so no whole
dequantized matrix is held."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from zerolayer.scheduler.model.gguf.dequantize import dequantize_reference
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight

CHUNK_ELEMENTS = 1 << 20
"""Weights dequantized at a time by :func:`quant_linear_chunked` (4 MiB of float32 scratch)."""

Dequantize = Callable[..., torch.Tensor]
"""``(weight, dtype, ids=None) -> [N or len(ids), K]``: :func:`dequantize_reference` or the
native ``gguf_dequantize`` (the same values)."""


def quant_linear_chunked(
    x: torch.Tensor,
    weight: QuantWeight,
    dequantize: Dequantize = dequantize_reference,
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.linear,
) -> torch.Tensor:
    """``linear(x, dequantize(weight))`` with the weight dequantized (to ``x``'s dtype: exact in
    float32, rounded once to bfloat16) a block of rows at a time; any M, any device.

    Args:
        linear: the product of x and a block of rows (``F.linear``, or the batch-invariant
            kernel).

    Returns:
        [M, N] in the dtype of ``x``.
    """
    n, k = weight.shape
    rows = max(1, CHUNK_ELEMENTS // k)
    if rows >= n:
        return linear(x, dequantize(weight, x.dtype).to(x.device))
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    for n0 in range(0, n, rows):
        block = dequantize(weight.rows(n0, n0 + rows), x.dtype).to(x.device)
        out[:, n0 : n0 + rows] = linear(x, block)
    return out
