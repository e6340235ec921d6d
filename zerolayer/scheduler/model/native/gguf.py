"""The GGUF kernels of ``csrc/gguf_linear.cpp`` and ``csrc/gguf_dequant.cpp`` as functions of
tensors; part of :class:`~zerolayer.scheduler.model.native.library.NativeKernels`."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.native.abi import DTYPE_CODES, check_call, pointers, refuse


class GgufKernels:
    """x [M, K] (bfloat16 or float32, any M) times weights of GGUF types read in place, and
    their rows dequantized."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        """``lib``: the library (declared, GIL released)."""
        self._lib = lib
        self.gguf_isa: str = lib.zl_gguf_isa().decode()
        """The kernels :meth:`gguf_linear` takes on this CPU: "avx512vnni", "avx2" or
        "portable"."""

    def gguf_linear(
        self, x: torch.Tensor, weight: QuantWeight, isa: str | None = None
    ) -> torch.Tensor:
        """``x`` [M, K] @ dequant(``weight`` [N, K])^T -> [M, N] in x's dtype: bfloat16 x
        quantized per block (Q8_0, or Q8_K for the K-quants) with int32 block sums, float32 x
        against the exactly dequantized weights (``csrc/gguf_linear.cpp``). ``isa``: the
        kernels of one instruction set ("avx512vnni", "avx2", "portable"; raises where this CPU
        does not run it), None: :attr:`gguf_isa`.

        Raises:
            RuntimeError: shapes, dtypes or devices it does not take, K not a multiple of the
                type's block size, a weight whose bytes do not match its shape.
        """
        return self._linear(x, [weight], isa, "gguf_linear")[0]

    def gguf_linear_multi(
        self, x: torch.Tensor, weights: Sequence[QuantWeight]
    ) -> list[torch.Tensor]:
        """``[gguf_linear(x, w) for w in weights]`` (the same values; any mix of types) with x
        quantized once and one parallel region over all their rows."""
        return self._linear(x, weights, None, "gguf_linear_multi")

    def gguf_dequantize(
        self,
        weight: QuantWeight,
        dtype: torch.dtype = torch.float32,
        ids: torch.Tensor | None = None,
        isa: str | None = None,
    ) -> torch.Tensor:
        """The weight's rows (``ids`` only, when given) dequantized: float32 exactly, or
        bfloat16 rounded once -> [N or len(ids), K] (``csrc/gguf_dequant.cpp``).

        Raises:
            RuntimeError: a dtype it does not write, a row id out of range.
        """
        if dtype not in DTYPE_CODES:
            refuse(f"gguf_dequantize: float32 or bfloat16 out expected, got {dtype}")
        self._check_weight(weight, weight.shape[1], "gguf_dequantize")
        n, k = weight.shape
        index = None
        if ids is not None:
            if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64) or not ids.is_cpu:
                refuse("gguf_dequantize: ids must be a 1-D CPU integer tensor")
            index = ids.to(torch.int64).contiguous()
        out = torch.empty(n if index is None else index.shape[0], k, dtype=dtype)
        rc = self._lib.zl_gguf_dequantize(
            weight.qtype.ggml_type,
            weight.data.data_ptr(),
            n,
            k,
            None if index is None else index.data_ptr(),
            0 if index is None else index.shape[0],
            DTYPE_CODES[dtype],
            out.data_ptr(),
            None if isa is None else isa.encode(),
            torch.get_num_threads(),
        )
        check_call(self._lib, rc)
        return out

    def _linear(
        self, x: torch.Tensor, weights: Sequence[QuantWeight], isa: str | None, who: str
    ) -> list[torch.Tensor]:
        if not weights:
            refuse(f"{who}: at least one weight expected")
        if x.dim() != 2 or x.dtype not in DTYPE_CODES or not x.is_cpu:
            refuse(f"{who}: a CPU bfloat16 or float32 x [M, K] expected")
        for w in weights:
            self._check_weight(w, x.shape[1], who)
        x = x.contiguous()
        m = x.shape[0]
        ys = [torch.empty(m, w.shape[0], dtype=x.dtype) for w in weights]
        count = len(weights)
        rc = self._lib.zl_gguf_linear(
            DTYPE_CODES[x.dtype],
            x.data_ptr(),
            m,
            x.shape[1],
            count,
            (ctypes.c_int32 * count)(*[w.qtype.ggml_type for w in weights]),
            pointers([w.data for w in weights]),
            (ctypes.c_int64 * count)(*[w.shape[0] for w in weights]),
            pointers(ys),
            None if isa is None else isa.encode(),
            torch.get_num_threads(),
        )
        check_call(self._lib, rc)
        return ys

    @staticmethod
    def _check_weight(w: QuantWeight, k: int, who: str) -> None:
        data, (n, wk) = w.data, w.shape
        if wk != k:
            refuse(f"{who}: x has {k} columns, the weight {wk}")
        if k % w.qtype.block_size:
            refuse(f"{who}: K = {k} is not a multiple of {w.qtype.name}'s block size")
        expected = (n, k // w.qtype.block_size * w.qtype.type_size)
        if data.dtype != torch.uint8 or tuple(data.shape) != expected:
            refuse(
                f"{who}: {w.qtype.name} [{n}, {k}] is uint8 {list(expected)}, "
                f"got {data.dtype} {list(data.shape)}"
            )
        if not (data.is_cpu and data.is_contiguous()):
            refuse(f"{who}: the weight must be a contiguous CPU tensor")
