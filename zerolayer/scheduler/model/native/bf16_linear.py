"""The bfloat16 linears of ``csrc/skinny_linear.cpp`` (the decode GEMV, up to
``max_skinny_rows`` rows of x) and ``csrc/bf16_gemm.cpp`` (any rows, where the CPU lacks AVX-512
BF16) as functions of tensors; part of
:class:`~zerolayer.scheduler.model.native.library.NativeKernels`."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from zerolayer.scheduler.model.native.abi import check_call, refuse

BFLOAT16 = torch.bfloat16


class Bf16Linears:
    """x [M, K] @ w [N, K]^T in bfloat16 with float32 accumulation, w read in place."""

    def __init__(self, lib: ctypes.CDLL, max_rows: int) -> None:
        """``lib``: the library (declared, GIL released); ``max_rows``: ``max_skinny_rows``."""
        self._lib = lib
        self.max_skinny_rows = max_rows
        self.has_bf16_dot = bool(lib.zl_has_bf16_dot())
        """Whether :meth:`skinny_linear` multiplies with AVX-512 BF16's ``vdpbf16ps``."""
        self.skinny_linear_isa: str = lib.zl_skinny_linear_isa(0).decode()
        """The path :meth:`skinny_linear` takes on this CPU: ``avx512bf16``, ``avx512``,
        ``avx2`` or ``portable``."""
        gemm_isa = lib.zl_bf16_gemm_isa()
        self.bf16_gemm_isa: str | None = (
            gemm_isa.decode() if gemm_isa is not None and not self.has_bf16_dot else None
        )
        """The path :meth:`try_bf16_gemm` takes (``avx2``), or None where torch's matmul is
        used: a CPU with AVX-512 BF16 (oneDNN's bfloat16 GEMM is faster), or none with AVX2."""

    def skinny_linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ w [N, K]^T in bfloat16 for M <= :attr:`max_skinny_rows` (decode GEMV),
        float32 accumulation -> [M, N]; K a multiple of 16, w contiguous."""
        if not (self._x_applies(x) and self._w_applies(x, w)):
            self._check_skinny(x, w, "skinny_linear")
        return self._skinny(x, w)

    def skinny_linear_widened(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """:meth:`skinny_linear` through its best float32-widening path, also where AVX-512 BF16
        is available (for comparisons)."""
        return self.skinny_linear_with_isa(x, w, "widened")

    def skinny_linear_with_isa(self, x: torch.Tensor, w: torch.Tensor, isa: str) -> torch.Tensor:
        """:meth:`skinny_linear` through the path ``isa`` (``avx512bf16``, ``avx512``, ``avx2``,
        ``portable``, or ``widened``: the best without ``vdpbf16ps``); raises RuntimeError where
        this CPU or build does not run it (tests and comparisons)."""
        if not (self._x_applies(x) and self._w_applies(x, w)):
            self._check_skinny(x, w, "skinny_linear")
        return self._skinny(x, w, isa)

    def try_skinny_linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
        """:meth:`skinny_linear` where it applies (bfloat16 CPU tensors, x [M, K] with 1 <= M <=
        :attr:`max_skinny_rows` and K a multiple of 16, w [N, K] contiguous); None elsewhere.
        The routing of :meth:`KernelLoader.linear`: its conditions are the checks."""
        if self._x_applies(x) and self._w_applies(x, w):
            return self._skinny(x, w)
        return None

    def skinny_linear_multi(
        self, x: torch.Tensor, ws: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """``[skinny_linear(x, w) for w in ws]`` (the same values) in one parallel region over
        all their rows, each w read in place."""
        if not ws:
            refuse("skinny_linear_multi: at least one w expected")
        if not (self._x_applies(x) and all(self._w_applies(x, w) for w in ws)):
            for w in ws:
                self._check_skinny(x, w, "skinny_linear_multi")
        return self._skinny_multi(x, ws)

    def try_skinny_linear_multi(
        self, x: torch.Tensor, ws: Sequence[torch.Tensor]
    ) -> list[torch.Tensor] | None:
        """:meth:`skinny_linear_multi` where :meth:`try_skinny_linear` applies to every w;
        None elsewhere."""
        return self._skinny_multi(x, ws, checked=False) if ws and self._x_applies(x) else None

    # NOTE: the conditions are one expression each (a decode step makes about a hundred of these
    # calls); a refusal is worded only when they fail.
    def _x_applies(self, x: torch.Tensor) -> bool:
        return (
            x.dtype == BFLOAT16
            and x.dim() == 2
            and x.is_cpu
            and 1 <= x.shape[0] <= self.max_skinny_rows
            and x.shape[1] % 16 == 0
        )

    @staticmethod
    def _w_applies(x: torch.Tensor, w: torch.Tensor) -> bool:
        return (
            w.dtype == BFLOAT16
            and w.dim() == 2
            and w.shape[1] == x.shape[1]
            and w.is_cpu
            and w.is_contiguous()
        )

    def _skinny(self, x: torch.Tensor, w: torch.Tensor, isa: str | None = None) -> torch.Tensor:
        x = x.contiguous()
        m, k = x.shape
        y = torch.empty(m, w.shape[0], dtype=BFLOAT16)
        check_call(
            self._lib,
            self._lib.zl_skinny_linear(
                x.data_ptr(),
                w.data_ptr(),
                y.data_ptr(),
                m,
                k,
                w.shape[0],
                None if isa is None else isa.encode(),
                torch.get_num_threads(),
            ),
        )
        return y

    def _skinny_multi(
        self, x: torch.Tensor, ws: Sequence[torch.Tensor], checked: bool = True
    ) -> list[torch.Tensor] | None:
        """The multi GEMV of checked x and ws; with ``checked`` False, ws are checked here, in
        the same pass that fills the call's arrays (None when one does not apply)."""
        x = x.contiguous()
        m, k = x.shape
        count = len(ws)
        weights, outputs = (ctypes.c_void_p * count)(), (ctypes.c_void_p * count)()
        rows = (ctypes.c_int64 * count)()
        ys = []
        for i, w in enumerate(ws):
            if not (checked or self._w_applies(x, w)):
                return None
            y = torch.empty(m, w.shape[0], dtype=BFLOAT16)
            ys.append(y)
            weights[i], outputs[i], rows[i] = w.data_ptr(), y.data_ptr(), w.shape[0]
        rc = self._lib.zl_skinny_linear_multi(
            x.data_ptr(), m, k, count, weights, rows, outputs, torch.get_num_threads()
        )
        check_call(self._lib, rc)
        return ys

    def _check_skinny(
        self, x: torch.Tensor, w: torch.Tensor, who: str, check_rows: bool = True
    ) -> None:
        if x.dim() != 2 or w.dim() != 2:
            refuse(f"{who}: x [M, K] and w [N, K] expected")
        if x.dtype != BFLOAT16 or w.dtype != BFLOAT16:
            refuse(f"{who}: bfloat16 x and w expected")
        if not (x.is_cpu and w.is_cpu):
            refuse(f"{who}: CPU tensors expected")
        if x.shape[1] != w.shape[1]:
            refuse(f"{who}: x has {x.shape[1]} columns, w {w.shape[1]}")
        if check_rows and not 1 <= x.shape[0] <= self.max_skinny_rows:
            refuse(f"{who}: 1 to {self.max_skinny_rows} rows of x")
        if x.shape[1] % 16:
            refuse(f"{who}: K must be a multiple of 16")
        if not w.is_contiguous():
            refuse(f"{who}: w must be contiguous")

    def bf16_gemm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ w [N, K]^T in bfloat16 for any M (``csrc/bf16_gemm.cpp``), float32
        accumulation -> [M, N]; K a multiple of 16, w contiguous.

        Raises:
            RuntimeError: the CPU or build has no path for it, or the operands do not apply.
        """
        if x.dim() != 2 or x.shape[0] < 1:
            refuse("bf16_gemm: x [M, K] with M >= 1 expected")
        self._check_skinny(x, w, "bf16_gemm", check_rows=False)
        return self._gemm(x, w)

    def try_bf16_gemm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
        """:meth:`bf16_gemm` where the scheduler takes it instead of torch's matmul (a
        :attr:`bf16_gemm_isa`, bfloat16 CPU tensors, x [M, K] with M above
        :attr:`max_skinny_rows` and K a multiple of 16, w [N, K] contiguous); None elsewhere."""
        if (
            self.bf16_gemm_isa is not None
            and x.dtype == BFLOAT16
            and x.dim() == 2
            and x.is_cpu
            and x.shape[0] > self.max_skinny_rows
            and x.shape[1] % 16 == 0
            and self._w_applies(x, w)
        ):
            return self._gemm(x, w)
        return None

    def _gemm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        (m, k), n = x.shape, w.shape[0]
        y = torch.empty(m, n, dtype=BFLOAT16)
        rc = self._lib.zl_bf16_gemm(
            x.data_ptr(), w.data_ptr(), y.data_ptr(), m, k, n, torch.get_num_threads()
        )
        check_call(self._lib, rc)
        return y
