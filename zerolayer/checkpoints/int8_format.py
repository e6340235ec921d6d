"""The zerolayer int8 checkpoint format: weight-only, symmetric, one scale per group of weights.

Like llama.cpp's Q8_0 (ggml-quants.c, ``quantize_row_q8_0``): each run of ``group_size``
consecutive input-dimension (K) elements of a weight row shares one scale ``max|w| / 127``, and
each weight is ``round(w / scale)`` in [-127, 127]. A linear weight ``<module>.weight`` [N, K]
is stored as int8 [N, K] under the same name, its scales as float32 [N, K / group_size] under
``<module>.weight_scale``; ``w ~= weight * weight_scale`` repeated over each group. config.json
says so with ``quantization_config = {"quant_method": "zerolayer_int8", "bits": 8,
"group_size": G}``. Embeddings and norms keep their dtype.

torch is imported by the functions that compute, not at import (config parsing does not need it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

QUANT_METHOD = "zerolayer_int8"
"""``quantization_config.quant_method`` of a zerolayer int8 checkpoint."""
BITS = 8
"""``quantization_config.bits``."""
DEFAULT_GROUP_SIZE = 32
"""Weights per scale by default (llama.cpp's Q8_0 block size)."""
SCALE_SUFFIX = "_scale"
"""``<module>.weight`` + this names the weight's scales."""
QMAX = 127
"""Largest magnitude of a quantized value (symmetric: -128 is never used)."""
PROJECTION_NAMES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "qkv_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "gate_up_proj",
)
"""Modules of a decoder layer whose weights are quantized (with ``lm_head``)."""


def scale_name(weight_name: str) -> str:
    """``"x.weight"`` -> ``"x.weight_scale"``: where a quantized weight's scales are stored."""
    return weight_name + SCALE_SUFFIX


def is_quantized_name(name: str) -> bool:
    """Whether a tensor of a checkpoint is a weight this format quantizes (by its name):
    ``lm_head.weight`` and the ``<projection>.weight`` of every layer."""
    if name == "lm_head.weight":
        return True
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in PROJECTION_NAMES


def quantization_config(group_size: int) -> dict:
    """config.json's ``quantization_config`` of an int8 checkpoint with ``group_size``."""
    return {"quant_method": QUANT_METHOD, "bits": BITS, "group_size": group_size}


def quantize_weight(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0-style symmetric quantization of ``w`` [N, K] in groups of ``group_size`` along K.

    Returns:
        (int8 [N, K], float32 scales [N, K / group_size]); an all-zero group has scale 0.

    Raises:
        ValueError: ``w`` is not 2-D, or K is not a multiple of ``group_size``.
    """
    import torch

    if w.dim() != 2:
        raise ValueError(f"a 2-D weight is quantized, got shape {list(w.shape)}")
    n, k = w.shape
    if group_size < 1 or k % group_size:
        raise ValueError(f"K={k} is not a multiple of the group size {group_size}")
    groups = w.float().reshape(n, k // group_size, group_size)
    scales = groups.abs().amax(dim=-1) / QMAX
    inverse = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
    q = torch.round(groups * inverse.unsqueeze(-1)).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.reshape(n, k), scales.contiguous()


def dequantize_weight(
    qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``qweight`` int8 [N, K] times its ``scales`` [N, K / G] -> [N, K] in ``dtype`` (default
    float32), computed in float32."""
    import torch

    n, k = qweight.shape
    groups = scales.shape[1]
    w = qweight.float().reshape(n, groups, k // groups) * scales.float().unsqueeze(-1)
    return w.reshape(n, k).to(dtype or torch.float32)
