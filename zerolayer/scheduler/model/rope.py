"""Rotary position embedding in the Hugging Face "rotate half" layout.

Su et al. 2021, "RoFormer" (arXiv:2104.09864); the llama3 frequency scaling follows Meta's
Llama 3.1 reference (transformers' ``_compute_llama3_parameters``).
"""

from __future__ import annotations

import math

import torch

from zerolayer.checkpoints.model_config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """float32 [head_dim / 2] angular frequencies, with linear or llama3 scaling applied, each
    then divided by its ``rope.freq_factors`` entry when there are any (llama.cpp's
    ``rope_freqs``: ``ggml_rope_ext``'s freq_factors divide theta)."""
    inv_freq = _scaled_inverse_frequencies(rope, head_dim)
    if rope.freq_factors:
        return inv_freq / torch.tensor(rope.freq_factors, dtype=torch.float32)
    return inv_freq


def _scaled_inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (
        rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    )
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
        high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding:
    """Precomputed cos/sin tables for positions ``[0, max_positions)``."""

    def __init__(
        self,
        rope: RopeConfig,
        head_dim: int,
        max_positions: int,
        device: torch.device | None = None,
    ) -> None:
        """``device``: where the tables live (default the CPU); they are computed on the CPU and
        copied there, so every device sees the same float32 values."""
        inv_freq = inverse_frequencies(rope, head_dim)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos()  # float32 [max_positions, head_dim]
        self.sin = emb.sin()
        if device is not None:
            self.cos, self.sin = self.cos.to(device), self.sin.to(device)

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of ``positions`` (int64 [T]) as [T, 1, head_dim] in ``dtype``."""
        return (
            self.cos[positions].unsqueeze(1).to(dtype),
            self.sin[positions].unsqueeze(1).to(dtype),
        )


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates ``x`` [T, H, D] by the position tables from :meth:`RotaryEmbedding.tables`."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
