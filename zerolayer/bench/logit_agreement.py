"""Teacher-forced agreement of two checkpoints of one model: argmax and cosine of the logits.

Both forwards read the same token sequence (not their own greedy choices, which part for good at
the first disagreement), so every position is compared under the same context. The sequence is
fed ``step_tokens`` at a time (4: every projection takes the decode path, e.g. the int8 kernel).
"""

from __future__ import annotations

from pathlib import Path

import torch

from zerolayer.bench.inprocess import LocalModel
from zerolayer.scheduler.model.attention import AttentionMetadata, PrefillSpan
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel

BLOCK_SIZE = 16
"""Block size of the throw-away KV cache."""


def chunked_logits(
    model_dir: Path,
    tokens: list[int],
    kernels: KernelLoader | None,
    step_tokens: int,
    block_size: int = BLOCK_SIZE,
) -> torch.Tensor:
    """float32 [len(tokens), vocab] logits of ``tokens`` fed ``step_tokens`` at a time through
    the forward of the checkpoint in ``model_dir``, on the CPU, over a fresh KV cache in the
    model's dtype (native kernels when ``kernels`` loads them; None: pure torch)."""
    local = LocalModel.load(model_dir)
    return model_logits(
        LlamaModel(local.config, local.weights), tokens, kernels, step_tokens, block_size
    )


def model_logits(
    model: LlamaModel,
    tokens: list[int],
    kernels: KernelLoader | None,
    step_tokens: int,
    block_size: int = BLOCK_SIZE,
) -> torch.Tensor:
    """:func:`chunked_logits` of a built model (on the CPU)."""
    cfg = model.config
    n = len(tokens)
    num_blocks = -(-n // block_size)
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    caches = [
        (torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype))
        for _ in model.layers
    ]
    block_ids = torch.arange(num_blocks)
    out = []
    for start in range(0, n, step_tokens):
        end = min(n, start + step_tokens)
        meta = span_metadata(start, end, block_ids, block_size)
        ids = torch.tensor(tokens[start:end])
        hidden = model.forward(ids, torch.arange(start, end), caches, meta, kernels)
        out.append(model.compute_logits(hidden, kernels))
    return torch.cat(out)


def span_metadata(
    start: int, end: int, block_ids: torch.Tensor, block_size: int
) -> AttentionMetadata:
    """One sequence's step feeding positions [start, end), its K/V at slots start..end-1 of the
    blocks ``block_ids`` (in order)."""
    used = block_ids[: -(-end // block_size)]
    return AttentionMetadata(
        slot_mapping=torch.arange(start, end),
        decode_rows=torch.zeros(0, dtype=torch.int64),
        decode_block_tables=torch.zeros(0, 1, dtype=torch.int64),
        decode_mask=torch.zeros(0, 1, 1, block_size, dtype=torch.bool),
        prefills=(PrefillSpan(0, end - start, end, used),),
        query_start_loc=torch.tensor([0, end - start]),
        seq_lens=torch.tensor([end]),
        block_tables=used.unsqueeze(0),
    )


def agreement(reference: torch.Tensor, other: torch.Tensor) -> dict:
    """Over positions (rows of two float32 [T, vocab] logit tensors): the fraction whose argmax
    is the same, and the mean and minimum cosine similarity of the logit vectors."""
    cosine = torch.nn.functional.cosine_similarity(reference.double(), other.double(), dim=-1)
    same = (reference.argmax(-1) == other.argmax(-1)).double()
    return {
        "positions": reference.shape[0],
        "argmax_agreement": float(same.mean()),
        "mean_logit_cosine": float(cosine.mean()),
        "min_logit_cosine": float(cosine.min()),
    }
