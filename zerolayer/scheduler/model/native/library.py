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
from collections.abc import Sequence
from pathlib import Path

import torch

from zerolayer.scheduler.model.native.abi import (
    ABI_VERSION,
    DTYPE_CODES,
    check_call,
    declare,
    pointers,
    refuse,
)
from zerolayer.scheduler.model.native.decode_step import DecodeForward
from zerolayer.scheduler.model.native.elementwise import ElementwiseKernels

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
        self.max_skinny_rows: int = self._lib.zl_max_skinny_rows()
        """Most rows of x the decode GEMVs take."""
        self.has_bf16_dot = bool(self._lib.zl_has_bf16_dot())
        """Whether :meth:`skinny_linear` multiplies with AVX-512 BF16's ``vdpbf16ps``."""
        elementwise = ElementwiseKernels(held)
        self.rms_norm = elementwise.rms_norm
        self.add_rms_norm = elementwise.add_rms_norm
        self.rotary = elementwise.rotary

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Causal GQA over the paged cache (``csrc/paged_attention.cpp``); the arguments and the
        result as :meth:`KernelLoader.paged_attention_native` documents them."""
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
        num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
        if head_dim != q.shape[2]:
            refuse("q and the caches differ in head_dim")
        if block_tables.dim() != 2:
            refuse("block_tables must be [B, max_blocks]")
        if seq_lens.dim() != 1 or query_start_loc.dim() != 1:
            refuse("seq_lens/query_start_loc must be 1-D")
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
                torch.get_num_threads(),
            ),
        )
        return out

    def skinny_linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ w [N, K]^T in bfloat16 for M <= :attr:`max_skinny_rows` (decode GEMV),
        float32 accumulation -> [M, N]; K a multiple of 16, w contiguous."""
        return self._skinny(x, w, widened=False)

    def skinny_linear_widened(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """:meth:`skinny_linear` through its float32-widening loop, also where AVX-512 BF16 is
        available (for comparisons)."""
        return self._skinny(x, w, widened=True)

    def _skinny(self, x: torch.Tensor, w: torch.Tensor, widened: bool) -> torch.Tensor:
        m, k = self._skinny_x(x, "skinny_linear")
        self._skinny_w(x, w, "skinny_linear")
        x = x.contiguous()
        n = w.shape[0]
        y = torch.empty(m, n, dtype=BFLOAT16)
        check_call(
            self._lib,
            self._lib.zl_skinny_linear(
                x.data_ptr(), w.data_ptr(), y.data_ptr(), m, k, n, widened, torch.get_num_threads()
            ),
        )
        return y

    def skinny_linear_multi(
        self, x: torch.Tensor, ws: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """``[skinny_linear(x, w) for w in ws]`` (the same values) in one parallel region over
        all their rows, each w read in place."""
        if not ws:
            refuse("skinny_linear_multi: at least one w expected")
        m, k = self._skinny_x(x, "skinny_linear_multi")
        for w in ws:
            self._skinny_w(x, w, "skinny_linear_multi")
        x = x.contiguous()
        ns = [w.shape[0] for w in ws]
        ys = [torch.empty(m, n, dtype=BFLOAT16) for n in ns]
        check_call(
            self._lib,
            self._lib.zl_skinny_linear_multi(
                x.data_ptr(),
                m,
                k,
                len(ws),
                pointers(ws),
                (ctypes.c_int64 * len(ns))(*ns),
                pointers(ys),
                torch.get_num_threads(),
            ),
        )
        return ys

    # NOTE: each check is one expression first (a decode step makes about a hundred of these
    # calls), and words its refusal only when it fails.
    def _skinny_x(self, x: torch.Tensor, who: str) -> tuple[int, int]:
        """Checks x [M, K] of a decode GEMV; returns (M, K)."""
        if not (
            x.dtype == BFLOAT16
            and x.dim() == 2
            and x.is_cpu
            and 1 <= x.shape[0] <= self.max_skinny_rows
            and x.shape[1] % 16 == 0
        ):
            self._check_skinny(x, x, who)
        return x.shape[0], x.shape[1]

    def _skinny_w(self, x: torch.Tensor, w: torch.Tensor, who: str) -> None:
        """Checks w [N, K] against a checked x."""
        if not (
            w.dtype == BFLOAT16
            and w.dim() == 2
            and w.shape[1] == x.shape[1]
            and w.is_cpu
            and w.is_contiguous()
        ):
            self._check_skinny(x, w, who)

    def _check_skinny(self, x: torch.Tensor, w: torch.Tensor, who: str) -> None:
        if x.dim() != 2 or w.dim() != 2:
            refuse(f"{who}: x [M, K] and w [N, K] expected")
        if x.dtype != BFLOAT16 or w.dtype != BFLOAT16:
            refuse(f"{who}: bfloat16 x and w expected")
        if not (x.is_cpu and w.is_cpu):
            refuse(f"{who}: CPU tensors expected")
        if x.shape[1] != w.shape[1]:
            refuse(f"{who}: x has {x.shape[1]} columns, w {w.shape[1]}")
        if not 1 <= x.shape[0] <= self.max_skinny_rows:
            refuse(f"{who}: 1 to {self.max_skinny_rows} rows of x")
        if x.shape[1] % 16:
            refuse(f"{who}: K must be a multiple of 16")
        if not w.is_contiguous():
            refuse(f"{who}: w must be contiguous")

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

    def int8_linear(self, x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ dequant(w int8 [N, K], scales float32 [N, K / G])^T for M <=
        :attr:`max_skinny_rows`: x quantized to int8 per group, int32 group sums (VNNI where
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

    def decode_forward(self, *args: object, **kwargs: object) -> DecodeForward:
        """The fused decode step over one model's weights (see :class:`DecodeForward`)."""
        return DecodeForward(self._lib, self.max_skinny_rows, *args, **kwargs)
