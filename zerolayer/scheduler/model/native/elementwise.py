"""The elementwise steps of ``csrc/elementwise.cpp`` (RMSNorm, the residual add and norm, RoPE)
as functions of bfloat16 tensors; part of :class:`~zerolayer.scheduler.model.native.library.
NativeKernels`."""

from __future__ import annotations

import ctypes

import torch

from zerolayer.scheduler.model.native.abi import DTYPE_CODES, check_call, refuse

BFLOAT16 = torch.bfloat16


class ElementwiseKernels:
    """Calls that keep the GIL: each takes microseconds, less than handing the GIL to another
    thread and getting it back."""

    def __init__(self, lib: ctypes.PyDLL) -> None:
        """``lib``: the library loaded with ``ctypes.PyDLL`` (declared)."""
        self._lib = lib

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of bfloat16 x [..., H] by weight [H] (bfloat16 or float32), normalized in
        float32 -> x's shape and dtype."""
        self._check_norm(x, weight, "rms_norm")
        y = torch.empty_like(x)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        check_call(
            self._lib,
            self._lib.zl_rms_norm(
                x.data_ptr(),
                weight.data_ptr(),
                DTYPE_CODES[weight.dtype],
                y.data_ptr(),
                rows,
                x.shape[-1],
                eps,
                torch.get_num_threads(),
            ),
        )
        return y

    def add_rms_norm(
        self, h: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h + d, rms_norm(h + d, weight, eps))``, the sum rounded to h's dtype."""
        self._check_norm(h, weight, "add_rms_norm")
        if d.shape != h.shape or d.dtype != h.dtype or not d.is_contiguous() or not d.is_cpu:
            refuse("add_rms_norm: d must be a contiguous tensor of h's shape and dtype")
        s, y = torch.empty_like(h), torch.empty_like(h)
        rows = h.numel() // h.shape[-1] if h.shape[-1] else 0
        check_call(
            self._lib,
            self._lib.zl_add_rms_norm(
                h.data_ptr(),
                d.data_ptr(),
                weight.data_ptr(),
                DTYPE_CODES[weight.dtype],
                s.data_ptr(),
                y.data_ptr(),
                rows,
                h.shape[-1],
                eps,
                torch.get_num_threads(),
            ),
        )
        return s, y

    def _check_norm(self, x: torch.Tensor, weight: torch.Tensor, who: str) -> None:
        # NOTE: one expression first (a decode step makes dozens of these calls); the refusal
        # is worded only when it fails.
        if (
            x.dtype == BFLOAT16
            and x.is_contiguous()
            and x.dim() >= 1
            and weight.dim() == 1
            and weight.shape[0] == x.shape[-1]
            and weight.dtype in (BFLOAT16, torch.float32)
            and weight.is_contiguous()
            and x.is_cpu
            and weight.is_cpu
        ):
            return
        if x.dtype != BFLOAT16:
            refuse(f"{who}: bfloat16 x expected")
        if x.dim() < 1 or not x.is_contiguous():
            refuse(f"{who}: contiguous x [..., H] expected")
        if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
            refuse(f"{who}: weight [{x.shape[-1]}] expected, got {list(weight.shape)}")
        if not weight.is_contiguous() or weight.dtype not in (BFLOAT16, torch.float32):
            refuse(f"{who}: contiguous bfloat16 or float32 weight expected")
        if not (x.is_cpu and weight.is_cpu):
            refuse(f"{who}: CPU tensors expected")

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE (rotate-half) of bfloat16 x [T, heads, D] by cos, sin [T, 1, D] -> [T, heads, D]."""
        if not (
            x.dtype == cos.dtype == sin.dtype == BFLOAT16
            and x.dim() == 3
            and x.is_contiguous()
            and x.shape[2] % 2 == 0
            and x.shape[2] <= 1024
            and cos.numel() == sin.numel() == x.shape[0] * x.shape[2]
            and x.is_cpu
            and cos.is_cpu
            and sin.is_cpu
        ):
            self._check_rotary(x, cos, sin)
        t, heads, dim = x.shape
        # [T, 1, D] contiguous is [T, D] as the kernel reads it
        c = cos if cos.is_contiguous() else cos.reshape(t, dim).contiguous()
        s = sin if sin.is_contiguous() else sin.reshape(t, dim).contiguous()
        y = torch.empty_like(x)
        check_call(
            self._lib,
            self._lib.zl_rotary(
                x.data_ptr(),
                c.data_ptr(),
                s.data_ptr(),
                y.data_ptr(),
                t,
                heads,
                dim,
                torch.get_num_threads(),
            ),
        )
        return y

    @staticmethod
    def _check_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        if not x.dtype == cos.dtype == sin.dtype == BFLOAT16:
            refuse("rotary: bfloat16 x, cos and sin expected")
        if x.dim() != 3 or not x.is_contiguous():
            refuse("rotary: contiguous x [T, heads, D] expected")
        t, heads, dim = x.shape
        if dim % 2 or dim > 1024:
            refuse(f"rotary: even head dim up to 1024 expected, got {dim}")
        if cos.numel() != t * dim or sin.numel() != t * dim:
            shapes = f"{list(cos.shape)} and {list(sin.shape)}"
            refuse(f"rotary: cos and sin [T, 1, D] expected, got {shapes}")
        if not (x.is_cpu and cos.is_cpu and sin.is_cpu):
            refuse("rotary: CPU tensors expected")
