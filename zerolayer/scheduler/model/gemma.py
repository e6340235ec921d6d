"""The numerics in which Gemma (Gemma Team 2024, arXiv:2403.08295) and Gemma 2 (arXiv:2408.00118)
differ from Llama, as transformers' GemmaForCausalLM and Gemma2ForCausalLM compute them.

The decoder itself is :class:`zerolayer.scheduler.model.llama.LlamaModel`, which calls these when
the config asks for them (``gemma_norms``, ``scale_embeddings``, the soft-caps).
"""

from __future__ import annotations

import torch


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm of ``x`` [..., H]: normalized in float32, times ``1 + weight`` [H] in
    float32, then cast to ``x``'s dtype (transformers' GemmaRMSNorm; Llama casts before scaling).

    ``1 + weight`` is computed per call, as transformers does: the stored weight is used in place.
    """
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (1.0 + weight.float())).to(x.dtype)


def gemma_rms_norm_offset_stored(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`gemma_rms_norm` of a weight stored as ``1 + w`` (a GGUF Gemma file, llama.cpp's
    converter adds the 1): normalized in float32, times ``weight`` in float32, cast back; with
    ``weight`` = float32(1 + w) this is :func:`gemma_rms_norm`'s value exactly."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


def scale_embeddings(h: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """Embedded tokens ``h`` [T, H] times sqrt(hidden_size) rounded to ``h``'s dtype (transformers
    rounds the normalizer to the model dtype: sqrt(3072) becomes 55.5 in bfloat16)."""
    normalizer = torch.tensor(hidden_size**0.5, dtype=torch.float32).to(h.dtype)
    return h * normalizer.to(h.device)


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """tanh(x / cap) * cap, in ``x``'s dtype (Gemma 2's attention score and logit soft-capping)."""
    return torch.tanh(x / cap) * cap
