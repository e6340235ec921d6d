"""Tests for write_kv + paged_attention against dense causal attention over contiguous K/V.

Each case is one step mixing decodes (one query over a cached context), a fresh prefill and prefill
chunks on top of a cached prefix, with block tables drawn from a shuffled pool of block ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from factories import make_request

from zerolayer.scheduler.core.scheduler_output import ScheduledRequest, SchedulerOutput
from zerolayer.scheduler.model.attention import paged_attention, write_kv
from zerolayer.scheduler.model.model_runner import build_metadata

BLOCK_SIZE = 4
NUM_BLOCKS = 40
NUM_KV_HEADS = 2
HEAD_DIM = 8

# (num_cached_tokens, num_new_tokens) of each sequence in the step.
STEP = [
    (7, 1),  # decode
    (0, 9),  # fresh prefill
    (12, 1),  # decode at a block boundary
    (5, 6),  # chunk on a cached prefix, starting mid-block
    (3, 1),  # decode in the first block
    (8, 4),  # chunk starting at a block boundary, ending on one
    (1, 2),
]


@dataclass
class Sequence:
    """One sequence's full Q/K/V (all positions) and its place in the step."""

    num_cached: int
    num_new: int
    block_ids: list[int]
    q: torch.Tensor  # [L, Hq, D]
    k: torch.Tensor  # [L, Hkv, D]
    v: torch.Tensor


def make_sequences(seed: int, num_q_heads: int) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(NUM_BLOCKS, generator=g).tolist()
    sequences = []
    for num_cached, num_new in STEP:
        length = num_cached + num_new
        num_blocks = -(-length // BLOCK_SIZE)
        block_ids, free = free[:num_blocks], free[num_blocks:]
        sequences.append(
            Sequence(
                num_cached,
                num_new,
                block_ids,
                torch.randn(length, num_q_heads, HEAD_DIM, generator=g),
                torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=g),
                torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=g),
            )
        )
    return sequences


def make_caches(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Caches full of finite garbage, so reading a slot outside a sequence changes the result."""
    g = torch.Generator().manual_seed(seed + 1000)
    shape = (NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    return 100 * torch.randn(shape, generator=g), 100 * torch.randn(shape, generator=g)


def slots(block_ids: list[int], start: int, end: int) -> list[int]:
    return [block_ids[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, end)]


def dense_attention(seq: Sequence, scale: float) -> torch.Tensor:
    """[num_new, Hq, D]: queries at positions [num_cached, L) over keys [0, L), causal."""
    group = seq.q.shape[1] // NUM_KV_HEADS
    k = seq.k.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]
    v = seq.v.repeat_interleave(group, dim=1).transpose(0, 1)
    q = seq.q[seq.num_cached :].transpose(0, 1)  # [Hq, n, D]
    scores = q @ k.transpose(1, 2) * scale  # [Hq, n, L]
    query_pos = torch.arange(seq.num_cached, seq.num_cached + seq.num_new).unsqueeze(1)
    causal = torch.arange(seq.k.shape[0]).unsqueeze(0) <= query_pos
    scores = scores.masked_fill(~causal, float("-inf"))
    return (scores.softmax(dim=-1) @ v).transpose(0, 1)


@pytest.mark.parametrize("gqa_ratio", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paged_attention_matches_dense_causal_attention(gqa_ratio: int, seed: int) -> None:
    num_q_heads = NUM_KV_HEADS * gqa_ratio
    sequences = make_sequences(seed, num_q_heads)
    k_cache, v_cache = make_caches(seed)
    # An earlier step cached each sequence's prefix.
    for seq in sequences:
        if seq.num_cached:
            prefix = torch.tensor(slots(seq.block_ids, 0, seq.num_cached))
            write_kv(k_cache, v_cache, seq.k[: seq.num_cached], seq.v[: seq.num_cached], prefix)

    output = SchedulerOutput(
        [
            ScheduledRequest(
                make_request(str(i), range(3, 3 + s.num_cached + s.num_new), s.block_ids),
                s.num_cached,
                s.num_new,
                samples=True,
            )
            for i, s in enumerate(sequences)
        ]
    )
    _, positions, meta, _ = build_metadata(output, BLOCK_SIZE)
    assert positions.tolist() == [
        p for s in sequences for p in range(s.num_cached, s.num_cached + s.num_new)
    ]
    assert meta.slot_mapping.tolist() == [
        slot
        for s in sequences
        for slot in slots(s.block_ids, s.num_cached, s.num_cached + s.num_new)
    ]
    assert meta.decode_rows.tolist() == [0, 10, 17]
    assert [span.start for span in meta.prefills] == [1, 11, 18, 22]

    new = [slice(s.num_cached, s.num_cached + s.num_new) for s in sequences]
    q = torch.cat([s.q[rows] for s, rows in zip(sequences, new, strict=True)])
    k = torch.cat([s.k[rows] for s, rows in zip(sequences, new, strict=True)])
    v = torch.cat([s.v[rows] for s, rows in zip(sequences, new, strict=True)])
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    scale = HEAD_DIM**-0.5
    out = paged_attention(q, k_cache, v_cache, meta, scale)

    expected = torch.cat([dense_attention(s, scale) for s in sequences])
    assert out.shape == (q.shape[0], num_q_heads, HEAD_DIM)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_write_kv_stores_each_token_in_its_slot() -> None:
    k_cache = torch.zeros(3, BLOCK_SIZE, 1, 2)
    v_cache = torch.zeros(3, BLOCK_SIZE, 1, 2)
    k = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]]])
    write_kv(k_cache, v_cache, k, -k, torch.tensor([9, 2]))  # block 2 offset 1, block 0 offset 2
    assert k_cache[2, 1, 0].tolist() == [1.0, 2.0]
    assert k_cache[0, 2, 0].tolist() == [3.0, 4.0]
    assert v_cache[2, 1, 0].tolist() == [-1.0, -2.0]
    assert int((k_cache != 0).sum()) == 4
    assert int((v_cache != 0).sum()) == 4
