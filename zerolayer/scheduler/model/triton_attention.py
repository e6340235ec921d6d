"""Causal grouped-query attention over the paged KV cache on CUDA, as one Triton kernel.

The CUDA counterpart of ``csrc/paged_attention.cpp`` with the same arguments: every sequence of
the step, decodes and prefill chunks alike, attends over its context by reading K and V straight
from the cache blocks its block table names (Kwon et al. 2023, "PagedAttention"), through an
online softmax in float32 (Dao et al. 2022, "FlashAttention"). The program itself is in
:mod:`zerolayer.scheduler.model.triton_attention_kernel`.

A decode step can be captured in a CUDA graph: the launch grid depends only on Python ints (the
batch size, the number of KV heads and ``max_query_len``), the kernel reads ``query_start_loc``,
``seq_lens`` and the block tables on the device and bounds its key loop by them, and nothing
here synchronises with the host. Replaying the graph after rewriting those tensors in place
attends over the new contexts.

Triton is imported on first use, never at import, so this module loads on machines without
Triton or CUDA; :func:`triton_available` tells whether the kernel can run. Triton's interpreter
(``TRITON_INTERPRET=1`` while the kernel is first used) runs the same kernel on CPU tensors, which
is how the tests check its logic without a GPU.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Any

import torch

log = logging.getLogger(__name__)

TRITON_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
"""Dtypes of q and the caches the kernel handles."""
INDEX_DTYPES = frozenset({torch.int32, torch.int64})
"""Dtypes of ``query_start_loc``, ``seq_lens`` and ``block_tables``."""
MAX_ROWS_PER_TILE = 64
"""Rows (queries times query heads of one KV head) a program aims for in a prefill tile."""
MIN_DOT_DIM = 16
"""Smallest extent of a ``tl.dot`` operand Triton accepts."""
KEY_TILE_BYTES = 16384
"""Bytes of one K (or V) tile a program loads per step of its key loop."""


@functools.cache
def _triton() -> ModuleType | None:
    """The ``triton`` package, or None when it does not import (logged once)."""
    try:
        import triton
        import triton.language  # noqa: F401 (the kernel module needs it)
    except Exception as e:  # any import failure means no Triton path
        log.info("triton unavailable (%s: %s)", type(e).__name__, e)
        return None
    return triton


def triton_available() -> bool:
    """Whether the Triton kernel can run here: Triton imports and a CUDA device exists.

    Imports Triton on the first call (about a second); never raises.
    """
    return torch.cuda.is_available() and _triton() is not None


@functools.cache
def _jit_kernel(interpret: bool) -> Any:
    """The kernel decorated by ``triton.jit``: compiled (False) or interpreted (True).

    Cached because a ``JITFunction`` holds its compiled binaries; ``triton.jit`` reads
    ``TRITON_INTERPRET`` when it decorates, so the caller passes the current setting and each
    gets its own object.
    """
    triton = _triton()
    from zerolayer.scheduler.model.triton_attention_kernel import paged_attention_kernel

    return triton.jit(paged_attention_kernel)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def launch_config(
    group: int, head_dim: int, max_query_len: int, element_size: int
) -> dict[str, int]:
    """Tile sizes for ``group`` query heads per KV head, as the kernel's constexpr arguments.

    A decode step (``max_query_len`` 1) gets one query per program; prefill tiles aim for
    :data:`MAX_ROWS_PER_TILE` rows. Every ``tl.dot`` extent is at least :data:`MIN_DOT_DIM`. A K or
    V tile holds at most :data:`KEY_TILE_BYTES` (64 keys of a 128-dim bfloat16 head, 32 of a
    float32 one), so the pipelined tiles fit in shared memory.
    """
    group_pad = _next_power_of_2(group)
    block_q = min(_next_power_of_2(max_query_len), max(1, MAX_ROWS_PER_TILE // group_pad))
    block_d = max(MIN_DOT_DIM, _next_power_of_2(head_dim))
    return {
        "GROUP": group,
        "GROUP_PAD": group_pad,
        "BLOCK_Q": block_q,
        "BLOCK_M": max(MIN_DOT_DIM, block_q * group_pad),
        "BLOCK_D": block_d,
        "BLOCK_N": max(MIN_DOT_DIM, min(64, KEY_TILE_BYTES // (block_d * element_size))),
    }


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_query_len: int,
) -> torch.Tensor:
    """Causal grouped-query attention over the paged cache, in one Triton launch.

    Reads K/V in place through the block tables (K/V of this step already written); does not
    modify the caches. Scores and the softmax are float32 (fp16/bf16 inputs go through the tensor
    cores; float32 uses exact float32 dots, not TF32). Never synchronises with the host.

    Args:
        q: [T, Hq, D] float16, bfloat16 or float32, Hq a multiple of Hkv; any strides.
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], same dtype as ``q``; any strides.
        query_start_loc: int32/int64 [B + 1], contiguous: sequence b owns query rows
            ``[query_start_loc[b], query_start_loc[b + 1])``, in increasing order.
        seq_lens: int32/int64 [B], contiguous: context length of each sequence after this
            step; query i of sequence b sits at position ``seq_lens[b] - num_queries_b + i`` and
            sees the keys at positions up to its own.
        block_tables: int32/int64 [B, max_blocks], padded rows, any strides; the first
            ``ceil(seq_lens[b] / block_size)`` entries of row b are read, and no entry past them.
        scale: softmax scale, usually D ** -0.5.
        max_query_len: a Python int at least the largest ``num_queries_b`` (1 for a decode step);
            it sizes the launch grid, so a smaller value silently leaves queries out.

    Returns:
        [T, Hq, D] contiguous, in the dtype of ``q``. Rows that no sequence owns (a batch padded
        for a CUDA graph: sequences with no queries, or rows past ``query_start_loc[B]``) are 0.

    Raises:
        RuntimeError: Triton does not import.
        ValueError: shapes, dtypes or devices disagree, or the tensors are on the CPU without
            Triton's interpreter. The contents of the metadata are not checked (that would need a
            host sync): block ids must name blocks of the cache, else the kernel reads out of
            bounds; a sequence with more queries than ``seq_lens`` gets zeros for the queries
            before position 0.
    """
    triton = _triton()
    if triton is None:
        raise RuntimeError("triton is not installed or does not import")
    from triton import knobs

    interpret = bool(knobs.runtime.interpret)
    _check_inputs(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, interpret)
    num_tokens, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs, max_blocks = block_tables.shape
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len < 1:
        raise ValueError(f"max_query_len must be at least 1 for {num_tokens} queries")
    config = launch_config(num_q_heads // num_kv_heads, head_dim, max_query_len, q.element_size())
    grid = (num_seqs, num_kv_heads, -(-max_query_len // config["BLOCK_Q"]))
    upcast = interpret and q.dtype == torch.bfloat16  # see the kernel's docstring
    _jit_kernel(interpret)[grid](
        out,
        q,
        k_cache,
        v_cache,
        query_start_loc,
        seq_lens,
        block_tables,
        scale * 1.4426950408889634,  # log2(e): the kernel's softmax is base 2
        *q.stride(),
        *out.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        max_blocks,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or upcast else None,
        UPCAST=upcast,
        **config,
    )
    return out


def _check_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    interpret: bool,
) -> None:
    """Raises ValueError naming the first argument whose shape, dtype or device is wrong."""
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"q must be [T, Hq, D] and k_cache 4-D, got {q.shape}, {k_cache.shape}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {v_cache.shape} differs from k_cache {k_cache.shape}")
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or num_q_heads % num_kv_heads:
        raise ValueError(
            f"q heads x dim {num_q_heads} x {head_dim} do not fit the cache's "
            f"{num_kv_heads} x {k_cache.shape[3]}"
        )
    if q.dtype not in TRITON_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"q, k_cache and v_cache must share a dtype among float16/bfloat16/float32, got "
            f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    index = {"query_start_loc": query_start_loc, "seq_lens": seq_lens, "block_tables": block_tables}
    for name, tensor in index.items():
        if tensor.dtype not in INDEX_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {tensor.dtype}")
    for name, tensor in (("query_start_loc", query_start_loc), ("seq_lens", seq_lens)):
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    num_seqs = block_tables.shape[0] if block_tables.dim() == 2 else -1
    if seq_lens.shape != (num_seqs,) or query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(
            f"want block_tables [B, N], seq_lens [B], query_start_loc [B + 1], got "
            f"{tuple(block_tables.shape)}, {tuple(seq_lens.shape)}, {tuple(query_start_loc.shape)}"
        )
    tensors = {"k_cache": k_cache, "v_cache": v_cache, **index}
    for name, tensor in tensors.items():
        if tensor.device != q.device:
            raise ValueError(f"{name} is on {tensor.device}, q on {q.device}")
    if q.device.type != "cuda" and not interpret:
        raise ValueError(
            f"q is on {q.device}: the kernel runs on CUDA, or under TRITON_INTERPRET=1"
        )
