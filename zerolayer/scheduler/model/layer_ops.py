"""The elementwise steps of a layer (norms, residual adds, RoPE), native where the kernels
apply and torch otherwise.

At batch 1 a decode step is dominated by per-call costs: RMSNorm alone is nine torch calls on a
row of 768 values (35 us here), the rotation of q four (25 us). ``csrc/elementwise.cpp`` does each
step in one call with the same roundings, for bfloat16 (see that file for what may differ: the
order of the float32 sum of squares).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from zerolayer.scheduler.model.native.library import NativeKernels
from zerolayer.scheduler.model.rope import apply_rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` [..., H]: normalized in float32, cast back, scaled by ``weight`` [H].

    ``weight`` may be stored in another dtype than ``x`` (float32 norms in a bfloat16
    checkpoint); it is cast to ``x``'s dtype, as transformers casts it at load. Source: Zhang &
    Sennrich 2019, "Root Mean Square Layer Normalization"; transformers' LlamaRMSNorm.
    """
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(x.dtype) * x32.to(x.dtype)


@dataclass(frozen=True)
class LayerOps:
    """A layer's elementwise steps for one model; ``norm`` is the model's RMSNorm
    (:func:`rms_norm`, or Gemma's ``1 + weight`` form).

    ``native`` is the loaded kernels or None; the native path is taken only for the
    standard :func:`rms_norm` and for contiguous bfloat16 CPU tensors, so float32 models and
    every device compute as before.
    """

    norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    native: NativeKernels | None = None

    def model_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """The model's ``norm(x, weight, eps)``: [..., H] -> [..., H] in ``x``'s dtype."""
        if self.norm is rms_norm:
            return self.rms_norm(x, weight, eps)
        return self.norm(x, weight, eps)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """:func:`rms_norm` (whatever the model's norm; Qwen3's q and k norms are this one)."""
        if self._native_norm(x, weight):
            return self.native.rms_norm(x, weight, eps)  # type: ignore[union-attr]
        return rms_norm(x, weight, eps)

    def add_norm(
        self, h: torch.Tensor, d: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add and the next norm: ``(s, norm(s))`` with ``s = h + d`` (``h`` when
        ``d`` is None), both [T, H] in ``h``'s dtype."""
        if d is None:
            return h, self.model_norm(h, weight, eps)
        if (
            self.norm is rms_norm
            and self._native_norm(h, weight)
            and d.dtype == h.dtype
            and d.shape == h.shape
            and d.is_contiguous()
            and d.is_cpu
        ):
            s, y = self.native.add_rms_norm(h, d, weight, eps)  # type: ignore[union-attr]
            return s, y
        s = h + d
        return s, self.norm(s, weight, eps)

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE of ``x`` [T, heads, D] by ``cos``, ``sin`` [T, 1, D] (see
        :func:`~zerolayer.scheduler.model.rope.apply_rotary`)."""
        if (
            self.native is not None
            and x.dtype == cos.dtype == sin.dtype == torch.bfloat16
            and x.dim() == 3
            and x.is_contiguous()
            and x.is_cpu
            and cos.is_cpu
            and sin.is_cpu
        ):
            return self.native.rotary(x, cos, sin)
        return apply_rotary(x, cos, sin)

    def _native_norm(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        return (
            self.native is not None
            and x.dtype == torch.bfloat16
            and x.is_contiguous()
            and weight.dim() == 1
            and weight.dtype in (torch.bfloat16, torch.float32)
            and weight.is_contiguous()
            and x.is_cpu
            and weight.is_cpu
        )
