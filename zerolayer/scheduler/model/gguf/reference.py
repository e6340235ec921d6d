"""What ``csrc/gguf_linear.cpp`` computes, in torch: the tests' reference of the native linear.

bfloat16 x against a quantized weight is quantized per block as the kernel does it (Q8_0 blocks
of 32 for the 32-element types, :func:`~zerolayer.scheduler.model.int8_linear.quantize_activations`;
Q8_K super-blocks of 256 for the K-quants, :func:`quantize_q8_k`); the kernel's integer block
sums times the scales are then exactly the dot product of the dequantized weight with the
dequantized x, which this computes in float64. Float32 x, and the float types, multiply x as
it is.
"""

from __future__ import annotations

import torch

from zerolayer.scheduler.model.gguf.dequantize import dequantize_reference
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.int8_linear import quantize_activations

Q8_K_BLOCK = 256
K_QUANTS = frozenset({"Q4_K", "Q5_K", "Q6_K"})


def quantize_q8_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] in Q8_K super-blocks of 256 (ggml-quants.c: ``quantize_row_q8_K_ref``): max,
    the value of largest magnitude (the first one), iscale = -127 / max, q = min(127,
    round(iscale * x)) (half to even), d = 1 / iscale; all-zero blocks get q = 0, d = 0.

    Returns:
        (float32 [M, K] holding the int8 values, float32 scales d [M, K / 256]).
    """
    m, k = x.shape
    blocks = x.float().reshape(m, k // Q8_K_BLOCK, Q8_K_BLOCK)
    largest = blocks.gather(-1, blocks.abs().argmax(dim=-1, keepdim=True))
    zero = largest == 0
    # NOTE: tensor / tensor: torch computes scalar / tensor as a reciprocal and a product,
    # which rounds twice.
    iscale = torch.where(zero, 0.0, torch.full_like(largest, -127.0) / largest.masked_fill(zero, 1))
    q = torch.round(iscale * blocks).clamp_(max=127)
    d = torch.where(zero, 0.0, torch.ones_like(iscale) / iscale.masked_fill(zero, 1))
    return q.reshape(m, k), d.squeeze(-1)


def quantized_x(x: torch.Tensor, qtype_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] as the bfloat16 kernels see it against a weight of ``qtype_name``.

    Returns:
        (x's dequantized value, float32 [M, K]; each value's quantization step d_x, [M, K]).
        For the float types x itself and zeros.
    """
    if qtype_name in ("F32", "F16", "BF16"):
        return x.float(), torch.zeros(x.shape)
    q, d = quantize_q8_k(x) if qtype_name in K_QUANTS else quantize_activations(x, 32)
    d = d.repeat_interleave(x.shape[1] // d.shape[1], dim=1)
    return q * d, d.abs()


def quant_linear_reference(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
    """``x`` [M, K] @ dequant(``weight``)^T as the native kernel computes it, in float64 (before
    the kernel's float32 rounding): bfloat16 x quantized per block against quantized types,
    x as it is otherwise.

    Returns:
        float64 [M, N].
    """
    w = dequantize_reference(weight).double()
    if x.dtype == torch.bfloat16:
        xs, _ = quantized_x(x, weight.qtype.name)
    else:
        xs = x.float()
    return xs.double() @ w.T
