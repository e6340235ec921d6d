"""The int8 decode GEMV of ``csrc/int8_linear.cpp`` (``zerolayer quantize`` weights) as
functions of tensors; part of :class:`~zerolayer.scheduler.model.native.library.NativeKernels`."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from zerolayer.scheduler.model.native.abi import DTYPE_CODES, check_call, pointers, refuse

BFLOAT16 = torch.bfloat16


class Int8Kernels:
    """x [M, K] (bfloat16 or float32, M at most ``max_rows``) times int8 weights [N, K] with
    float32 scales [N, K / G]."""

    def __init__(self, lib: ctypes.CDLL, max_rows: int) -> None:
        """``lib``: the library (declared, GIL released); ``max_rows``: ``max_skinny_rows``."""
        self._lib = lib
        self.max_skinny_rows = max_rows

    def int8_linear(self, x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ dequant(w int8 [N, K], scales float32 [N, K / G])^T for M <=
        ``max_skinny_rows``: x quantized to int8 per group, int32 group sums (VNNI where
        present) -> [M, N] in x's dtype (bfloat16 or float32)."""
        return self._int8(x, [(w, scales)], None, "int8_linear")[0]

    def int8_linear_with_isa(
        self, x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, isa: str
    ) -> torch.Tensor:
        """:meth:`int8_linear` with the kernel ``isa`` ("avx512vnni", "avx512vnni256", "avxvnni"
        or "portable"); raises if this CPU or the group size does not run it (comparisons)."""
        return self._int8(x, [(w, scales)], isa, "int8_linear")[0]

    def int8_linear_multi(
        self, x: torch.Tensor, weights: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> list[torch.Tensor]:
        """``[int8_linear(x, w, scales) for (w, scales) in weights]`` (same K and G, the same
        values) with x quantized once and one parallel region over all their rows."""
        return self._int8(x, weights, None, "int8_linear_multi")

    def int8_linear_isa(self, group_size: int) -> str:
        """The kernel :meth:`int8_linear` takes on this CPU for ``group_size``."""
        return self._lib.zl_int8_linear_isa(group_size).decode()

    def _int8(
        self,
        x: torch.Tensor,
        weights: Sequence[tuple[torch.Tensor, torch.Tensor]],
        isa: str | None,
        who: str,
    ) -> list[torch.Tensor]:
        if not weights:
            refuse(f"{who}: at least one weight expected")
        group_size = self._check_int8(x, *weights[0], who)
        for w, scales in weights[1:]:
            if self._check_int8(x, w, scales, who) != group_size:
                refuse(f"{who}: one group size for all weights")
        x = x.contiguous()
        m = x.shape[0]
        ys = [torch.empty(m, w.shape[0], dtype=x.dtype) for w, _ in weights]
        check_call(
            self._lib,
            self._lib.zl_int8_linear(
                DTYPE_CODES[x.dtype],
                x.data_ptr(),
                m,
                x.shape[1],
                group_size,
                len(weights),
                pointers([w for w, _ in weights]),
                pointers([s for _, s in weights]),
                (ctypes.c_int64 * len(weights))(*[w.shape[0] for w, _ in weights]),
                pointers(ys),
                None if isa is None else isa.encode(),
                torch.get_num_threads(),
            ),
        )
        return ys

    def _check_int8(self, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, who: str) -> int:
        """Checks x against one weight (w, s); returns its group size."""
        if x.dim() != 2 or w.dim() != 2 or s.dim() != 2:
            refuse(f"{who}: x [M, K], w [N, K] and scales [N, K / G] expected")
        if w.dtype != torch.int8:
            refuse(f"{who}: int8 w expected")
        if s.dtype != torch.float32:
            refuse(f"{who}: float32 scales expected")
        if x.dtype not in (BFLOAT16, torch.float32):
            refuse(f"{who}: bfloat16 or float32 x expected")
        if not (x.is_cpu and w.is_cpu and s.is_cpu):
            refuse(f"{who}: CPU tensors expected")
        if not (w.is_contiguous() and s.is_contiguous()):
            refuse(f"{who}: contiguous w and scales")
        (m, k), n = x.shape, w.shape[0]
        if w.shape[1] != k:
            refuse(f"{who}: x has {k} columns, w {w.shape[1]}")
        if s.shape[0] != n or s.shape[1] < 1 or k % s.shape[1]:
            refuse(f"{who}: scales [{n}, K / G] expected, got {list(s.shape)}")
        if not 1 <= m <= self.max_skinny_rows:
            refuse(f"{who}: 1 to {self.max_skinny_rows} rows of x")
        return k // s.shape[1]
