"""The Triton program behind :func:`.triton_attention.paged_attention_triton`.

Imports Triton at module level, so only :mod:`zerolayer.scheduler.model.triton_attention` imports
this module, and only once Triton is known to import. The function is left undecorated: the caller
applies ``triton.jit`` itself, once for the compiled CUDA kernel and once for Triton's CPU
interpreter (``TRITON_INTERPRET=1``, which tests use), since ``triton.jit`` picks between the two
when it decorates.

One program owns one sequence, one KV head and a tile of up to ``BLOCK_Q`` of the sequence's
queries. Its rows are those queries times the ``GROUP`` query heads sharing the KV head
(grouped-query attention, Ainslie et al. 2023), so each key tile read from the cache serves all of
them. Keys are read in place through the block table, one block id per key position (Kwon et al.
2023, "PagedAttention"), and folded into an online softmax with float32 running max, sum and
output (Milakov & Gimelshein 2018; Dao et al. 2022, "FlashAttention"; the tiling over queries of
one sequence follows FlashAttention-2, Dao 2023).
"""

from __future__ import annotations

import triton.language as tl


def paged_attention_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_bt_seq,
    stride_bt_block,
    max_blocks,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Grid (B, Hkv, ceil(max_query_len / BLOCK_Q)); see the module docstring.

    ``scale_log2`` is the softmax scale times log2(e) (the softmax runs in base 2). Row r of a
    program is query ``r // GROUP_PAD`` of its tile and query head ``r % GROUP_PAD`` of its group;
    rows past the tile, the group or the sequence's queries are computed as fully masked and never
    stored. ``UPCAST`` (the interpreter with bfloat16 only) feeds the dots float32 copies of the
    tiles: the interpreter keeps bfloat16 as raw 16-bit integers and its dot would multiply those.
    The products of two bfloat16 values are exact in float32, so only the summation order differs
    from the tensor-core path, and the probabilities are still rounded to bfloat16 first.
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    num_queries = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
    # NOTE: the grid is sized by the caller's max_query_len, not by this sequence: tiles past its
    # queries, and padded batch rows (no queries), stop here without reading or writing anything.
    if tile * BLOCK_Q >= num_queries:
        return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    num_cached = seq_len - num_queries

    rows = tl.arange(0, BLOCK_M)
    q_local = rows // GROUP_PAD
    q_index = tile * BLOCK_Q + q_local
    head_in_group = rows % GROUP_PAD
    row_valid = (q_local < BLOCK_Q) & (q_index < num_queries) & (head_in_group < GROUP)
    q_head = kv_head * GROUP + head_in_group
    # Invalid rows get position -1: they see no key, so their sum stays 0.
    q_pos = tl.where(row_valid, num_cached + q_index, -1)
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM

    q_token = (q_start + q_index).to(tl.int64)
    q_ptrs = (
        q_ptr
        + q_token[:, None] * stride_qt
        + q_head[:, None] * stride_qh
        + dims[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Causal: the tile's last query sees keys up to its own position, and no query sees past
    # seq_len (min() keeps inconsistent metadata from reading beyond the sequence).
    last_query = tl.minimum((tile + 1) * BLOCK_Q, num_queries)
    num_keys = tl.minimum(num_cached + last_query, seq_len)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for key_start in range(0, num_keys, BLOCK_N):
        key_pos = key_start + tl.arange(0, BLOCK_N)
        block_index = key_pos // BLOCK_SIZE
        key_valid = (key_pos < num_keys) & (block_index < max_blocks)
        block_ids = tl.load(table_row + block_index * stride_bt_block, mask=key_valid, other=0).to(
            tl.int64
        )
        in_block = key_pos % BLOCK_SIZE
        k_ptrs = (
            k_cache_ptr
            + block_ids[None, :] * stride_kb
            + in_block[None, :] * stride_ks
            + kv_head * stride_kh
            + dims[:, None] * stride_kd
        )
        k = tl.load(k_ptrs, mask=key_valid[None, :] & dim_valid[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2
        visible = key_valid[None, :] & (key_pos[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # A row with no visible key yet keeps max -inf; subtracting 0 instead of -inf keeps
        # exp2(-inf - -inf) = NaN out of its sum and output.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(scores - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = (
            v_cache_ptr
            + block_ids[:, None] * stride_vb
            + in_block[:, None] * stride_vs
            + kv_head * stride_vh
            + dims[None, :] * stride_vd
        )
        v = tl.load(v_ptrs, mask=key_valid[:, None] & dim_valid[None, :], other=0.0)
        # NOTE: probabilities go to the cache dtype for the tensor-core dot, as in FlashAttention;
        # the accumulation stays float32.
        p_low = p.to(v.dtype)
        if UPCAST:
            v = v.to(tl.float32)
            p_low = p_low.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p_low, v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    out_ptrs = (
        out_ptr
        + q_token[:, None] * stride_ot
        + q_head[:, None] * stride_oh
        + dims[None, :] * stride_od
    )
    tl.store(
        out_ptrs,
        out.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & dim_valid[None, :],
    )
