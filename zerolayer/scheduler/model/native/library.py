"""The kernels of ``libzerolayer_kernels.so`` as functions of torch tensors (ctypes bindings of
``csrc/api.h``).

Each wrapper checks dtypes, shapes, devices and contiguity, allocates the outputs with
``torch.empty`` and passes raw pointers and sizes; what only the data can tell (a block id, a
slot, a sequence length) the library checks before reading. A refused input raises
RuntimeError with the reason. Calls release the GIL (``ctypes.CDLL``), except the elementwise
steps, which take microseconds: less than handing the GIL over and getting it back
(``ctypes.PyDLL``). The library is loaded after torch, so its ``libgomp.so.1`` is torch's: one
OpenMP runtime, one thread pool, and each call runs on ``torch.get_num_threads()`` threads.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from zerolayer.scheduler.model.native.abi import (
    ABI_VERSION,
    DTYPE_CODES,
    check_call,
    declare,
    refuse,
)
from zerolayer.scheduler.model.native.bf16_linear import Bf16Linears
from zerolayer.scheduler.model.native.decode_step import DecodeForward
from zerolayer.scheduler.model.native.elementwise import ElementwiseKernels
from zerolayer.scheduler.model.native.gguf import GgufKernels
from zerolayer.scheduler.model.native.int8 import Int8Kernels

BFLOAT16 = torch.bfloat16


def _index(t: torch.Tensor, name: str) -> torch.Tensor:
    """An index tensor as the kernels read it: CPU int64, contiguous."""
    if t.dtype != torch.int64:
        if t.dtype != torch.int32:
            refuse(f"{name} must be int32 or int64")
        t = t.to(torch.int64)
    if not t.is_cpu:
        refuse(f"{name} must be on the CPU")
    return t.contiguous()


class NativeKernels:
    """The loaded library: what :meth:`KernelLoader.load` answers."""

    def __init__(self, path: Path) -> None:
        """
        Raises:
            OSError: the library does not load, or is of another ABI than this module's.
        """
        self.path = path
        self._lib = declare(ctypes.CDLL(str(path)))
        held = declare(ctypes.PyDLL(str(path)))  # the same library; calls keep the GIL
        if (version := self._lib.zl_abi_version()) != ABI_VERSION:
            raise OSError(f"{path}: ABI version {version}, this module's is {ABI_VERSION}")
        self.isa_cap: str = self._lib.zl_isa_cap().decode()
        """The build's cap on the kernels' instruction sets: ``native`` (whatever the CPU has),
        ``avx2`` or ``portable`` (``$ZEROLAYER_CPU_ISA`` when it was built)."""
        self.isa_level: str = self._lib.zl_isa_level().decode()
        """The best level the kernels run on this CPU under :attr:`isa_cap`: ``avx512``,
        ``avx2`` or ``portable``."""
        self.paged_attention_isa: str = self._lib.zl_paged_attention_isa().decode()
        """The path :meth:`paged_attention` takes on this CPU: ``avx512``, ``avx2`` or
        ``portable``."""
        self.max_skinny_rows: int = self._lib.zl_max_skinny_rows()
        """Most rows of x the decode GEMVs take."""
        linear = Bf16Linears(self._lib, self.max_skinny_rows)
        self.has_bf16_dot = linear.has_bf16_dot
        self.skinny_linear_isa = linear.skinny_linear_isa
        self.bf16_gemm_isa = linear.bf16_gemm_isa
        self.skinny_linear = linear.skinny_linear
        self.skinny_linear_widened = linear.skinny_linear_widened
        self.skinny_linear_with_isa = linear.skinny_linear_with_isa
        self.try_skinny_linear = linear.try_skinny_linear
        self.skinny_linear_multi = linear.skinny_linear_multi
        self.try_skinny_linear_multi = linear.try_skinny_linear_multi
        self.bf16_gemm = linear.bf16_gemm
        self.try_bf16_gemm = linear.try_bf16_gemm
        elementwise = ElementwiseKernels(held)
        self.rms_norm = elementwise.rms_norm
        self.add_rms_norm = elementwise.add_rms_norm
        self.rotary = elementwise.rotary
        int8 = Int8Kernels(self._lib, self.max_skinny_rows)
        self.int8_linear = int8.int8_linear
        self.int8_linear_with_isa = int8.int8_linear_with_isa
        self.int8_linear_multi = int8.int8_linear_multi
        self.int8_linear_isa = int8.int8_linear_isa
        gguf = GgufKernels(self._lib)
        self.gguf_isa = gguf.gguf_isa
        self.gguf_linear = gguf.gguf_linear
        self.gguf_linear_multi = gguf.gguf_linear_multi
        self.gguf_dequantize = gguf.gguf_dequantize

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: torch.Tensor,
        scale: float,
        isa: str | None = None,
    ) -> torch.Tensor:
        """Causal GQA over the paged cache (``csrc/paged_attention.cpp``); the arguments and the
        result as :meth:`KernelLoader.paged_attention_native` documents them. ``isa``: the path
        (``avx512``, ``avx2``, ``portable``; tests), None for :attr:`paged_attention_isa`."""
        if q.dim() != 3:
            refuse("q must be [T, Hq, D]")
        if k_cache.dim() != 4:
            refuse("k_cache must be [num_blocks, block_size, Hkv, D]")
        if k_cache.shape != v_cache.shape:
            refuse("k_cache and v_cache shapes differ")
        if not (q.is_cpu and k_cache.is_cpu and v_cache.is_cpu):
            refuse("q and the caches must be on the CPU")
        if q.dtype not in (torch.float32, BFLOAT16):
            refuse(f"q must be float32 or bfloat16, got {q.dtype}")
        if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
            refuse("q and the caches must share a dtype")
        if k_cache.shape[3] != q.shape[2]:
            refuse("q and the caches differ in head_dim")
        if block_tables.dim() != 2:
            refuse("block_tables must be [B, max_blocks]")
        if seq_lens.dim() != 1 or query_start_loc.dim() != 1:
            refuse("seq_lens/query_start_loc must be 1-D")
        num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
        starts = _index(query_start_loc, "query_start_loc")
        lens = _index(seq_lens, "seq_lens")
        tables = _index(block_tables, "block_tables")
        batch = lens.shape[0]
        if starts.shape[0] != batch + 1:
            refuse("query_start_loc must hold B + 1 entries")
        if tables.shape[0] != batch:
            refuse("block_tables must hold one row per sequence")
        q = q.contiguous()
        # NOTE: only the innermost dim needs to be dense; a strided view of an arena is read in
        # place.
        k = k_cache if k_cache.stride(3) == 1 else k_cache.contiguous()
        v = v_cache if v_cache.stride(3) == 1 else v_cache.contiguous()
        out = torch.empty_like(q)
        check_call(
            self._lib,
            self._lib.zl_paged_attention(
                DTYPE_CODES[q.dtype],
                q.data_ptr(),
                out.data_ptr(),
                q.shape[0],
                q.shape[1],
                head_dim,
                k.data_ptr(),
                v.data_ptr(),
                num_blocks,
                block_size,
                num_kv_heads,
                *k.stride()[:3],
                *v.stride()[:3],
                starts.data_ptr(),
                lens.data_ptr(),
                batch,
                tables.data_ptr(),
                tables.shape[1],
                scale,
                None if isa is None else isa.encode(),
                torch.get_num_threads(),
            ),
        )
        return out

    def invariant_linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ w [N, K]^T in bfloat16 or float32 (both the same) with a fixed reduction
        order per output: row m of the result depends only on x[m] and w -> [M, N]."""
        if x.dim() != 2 or w.dim() != 2:
            refuse("invariant_linear: x [M, K] and w [N, K] expected")
        if x.dtype != w.dtype or x.dtype not in (torch.float32, BFLOAT16):
            refuse(
                "invariant_linear: x and w both bfloat16 or both float32 expected, got "
                f"{x.dtype} and {w.dtype}"
            )
        if x.shape[1] != w.shape[1]:
            refuse(f"invariant_linear: x has {x.shape[1]} columns, w {w.shape[1]}")
        if not (x.is_cpu and w.is_cpu):
            refuse("invariant_linear: CPU tensors expected")
        x, w = x.contiguous(), w.contiguous()
        (m, k), n = x.shape, w.shape[0]
        y = torch.empty((m, n), dtype=x.dtype)
        check_call(
            self._lib,
            self._lib.zl_invariant_linear(
                DTYPE_CODES[x.dtype],
                x.data_ptr(),
                w.data_ptr(),
                y.data_ptr(),
                m,
                k,
                n,
                torch.get_num_threads(),
            ),
        )
        return y

    def decode_forward(self, *args: object, **kwargs: object) -> DecodeForward:
        """The fused decode step over one model's weights (see :class:`DecodeForward`)."""
        return DecodeForward(self._lib, self.max_skinny_rows, *args, **kwargs)
