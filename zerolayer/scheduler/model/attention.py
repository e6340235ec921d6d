"""Attention over the paged KV cache: the native kernel when it loads, else the torch reference.

K and V of every token are written into their cache slots (``slot_mapping``), then each sequence's
queries attend over its blocks through its block table (Kwon et al. 2023, "PagedAttention").

The native kernel (``csrc/paged_attention.cpp`` via :class:`KernelLoader`) on the CPU, and the
Triton kernel (:mod:`zerolayer.scheduler.model.triton_attention`) on CUDA, handle every sequence
of the step in one call over ``query_start_loc``/``seq_lens``/``block_tables``. The reference
gathers blocks: decodes (one query each) run as one padded batch; prefill chunks run one
``scaled_dot_product_attention`` each with a causal mask offset by the tokens already cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zerolayer.scheduler.model.gemma import soft_cap
from zerolayer.scheduler.model.kernels import NATIVE_DTYPES, KernelLoader
from zerolayer.scheduler.model.triton_attention import (
    TRITON_DTYPES,
    paged_attention_triton,
    triton_available,
)


@dataclass(frozen=True)
class PrefillSpan:
    """A sequence fed several tokens this step."""

    start: int
    """First row of its queries in the step's flat token array."""
    num_tokens: int
    """Queries of this step."""
    seq_len: int
    """Context length after this step (cached + new tokens)."""
    block_ids: torch.Tensor
    """int64 [ceil(seq_len / block_size)]: its block table."""


@dataclass(frozen=True)
class AttentionMetadata:
    """Everything attention needs about one step's batch; built by the model runner.

    Shapes: T tokens in the step, B sequences (Bd of them decodes), N the longest block table,
    M the longest decode block table. ``slot_mapping`` serves both paths; the ``decode_*`` and
    ``prefills`` fields serve the reference, the last three the native kernel.
    """

    slot_mapping: torch.Tensor
    """int64 [T]: cache slot (block_id * block_size + offset) of each token's K and V."""
    decode_rows: torch.Tensor
    """int64 [Bd]: rows of decode tokens in the flat array."""
    decode_block_tables: torch.Tensor
    """int64 [Bd, M]: block tables of the decode sequences, padded with 0."""
    decode_mask: torch.Tensor
    """bool [Bd, 1, 1, M * block_size]: True where a key position is inside the sequence."""
    prefills: tuple[PrefillSpan, ...]
    """The sequences fed more than one token."""
    query_start_loc: torch.Tensor
    """int64 [B + 1]: sequence b's queries are rows ``[query_start_loc[b], query_start_loc[b+1])``
    of the flat array (all sequences of the step, in order)."""
    seq_lens: torch.Tensor
    """int64 [B]: context length of each sequence after this step (cached + new tokens)."""
    block_tables: torch.Tensor
    """int64 [B, N]: block tables of all sequences, padded with 0."""

    @property
    def max_query_len(self) -> int:
        """Most queries of one sequence this step (1 when all decode); sizes the Triton grid."""
        return max((span.num_tokens for span in self.prefills), default=1)


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores K and V of this step's tokens in their slots.

    Args:
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], modified in place.
        k, v: [T, Hkv, D].
        slot_mapping: int64 [T].
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """[..., nb] block ids -> [..., Hkv, nb * block_size, D] keys or values."""
    blocks = cache[block_ids]  # [..., nb, bs, Hkv, D]
    *lead, nb, bs, h, d = blocks.shape
    return blocks.reshape(*lead, nb * bs, h, d).transpose(-3, -2)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    kernels: KernelLoader | None = None,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of this step's queries over the cached context (K/V already written).

    On CUDA runs the Triton kernel (:func:`paged_attention_triton`) when Triton imports; on the
    CPU runs the native kernel when ``kernels`` loads it and handles ``q.dtype``; else
    :func:`paged_attention_reference` (same arguments, shapes and result up to rounding). The
    first call may build the kernel (see :meth:`KernelLoader.load`). Does not modify the caches.
    With ``softcap`` or ``window`` (Gemma 2's attention logit soft-capping and sliding window) the
    reference runs whatever the device and kernels: only it implements them.
    """
    if softcap is not None or window is not None:
        return paged_attention_reference(q, k_cache, v_cache, meta, scale, softcap, window)
    if q.is_cuda:
        if q.dtype in TRITON_DTYPES and triton_available():
            return paged_attention_triton(
                q,
                k_cache,
                v_cache,
                meta.query_start_loc,
                meta.seq_lens,
                meta.block_tables,
                scale,
                meta.max_query_len,
            )
    elif kernels is not None and q.dtype in NATIVE_DTYPES:
        module = kernels.load()
        if module is not None:
            return module.paged_attention(
                q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, scale
            )
    return paged_attention_reference(q, k_cache, v_cache, meta, scale)


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of this step's queries over the cached context (K/V already written).

    Args:
        q: [T, Hq, D] queries, Hq a multiple of Hkv (grouped-query attention, Ainslie et al. 2023).
        k_cache, v_cache: [num_blocks, block_size, Hkv, D].
        meta: the step's metadata.
        scale: softmax scale, usually D ** -0.5.
        softcap: scaled scores s become tanh(s / softcap) * softcap before the mask and softmax
            (Gemma 2, as transformers' eager attention); None: no capping.
        window: a query at position p sees only keys at positions > p - window (transformers'
            sliding_window_overlay); None: all earlier keys.

    Returns:
        [T, Hq, D] attention output, same dtype as ``q``.
    """
    out = torch.empty_like(q)
    if meta.decode_rows.numel():
        qd = q[meta.decode_rows].unsqueeze(2)  # [Bd, Hq, 1, D]
        kd = _gather(k_cache, meta.decode_block_tables)  # [Bd, Hkv, L, D]
        vd = _gather(v_cache, meta.decode_block_tables)
        mask = meta.decode_mask
        if window is not None:
            # The decode query sits at seq_len - 1, seq_len being the mask's count of keys.
            key_pos = torch.arange(mask.shape[-1], device=q.device)
            seq_lens = mask.sum(-1, keepdim=True)
            mask = mask & (key_pos > seq_lens - 1 - window)
        od = _attention(qd, kd, vd, mask, scale, softcap)
        out[meta.decode_rows] = od.squeeze(2)
    for span in meta.prefills:
        rows = slice(span.start, span.start + span.num_tokens)
        qp = q[rows].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        kp = _gather(k_cache, span.block_ids)[:, : span.seq_len].unsqueeze(0)
        vp = _gather(v_cache, span.block_ids)[:, : span.seq_len].unsqueeze(0)
        # Query i sits at absolute position seq_len - n + i and sees keys up to there.
        first = span.seq_len - span.num_tokens
        key_pos = torch.arange(span.seq_len, device=q.device)
        query_pos = torch.arange(first, span.seq_len, device=q.device).unsqueeze(1)
        mask = key_pos.unsqueeze(0) <= query_pos
        if window is not None:
            mask = mask & (key_pos.unsqueeze(0) > query_pos - window)
        op = _attention(qp, kp, vp, mask, scale, softcap)
        out[rows] = op.squeeze(0).transpose(0, 1)
    return out


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """Masked attention of q [B, Hq, n, D] over k, v [B, Hkv, L, D] (bool mask, True: attend).

    Without ``softcap``: ``scaled_dot_product_attention``. With it: transformers' eager order
    (Gemma 2): scores in q's dtype, scaled, capped, masked, softmax in float32 cast back, times v.
    """
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = soft_cap(torch.matmul(q, k.transpose(-1, -2)) * scale, softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)
