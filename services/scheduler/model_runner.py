"""Turns a step's plan into model inputs, runs the forward and returns logits to sample from."""

from __future__ import annotations

import torch

from services.scheduler.attention import AttentionMetadata, PrefillSpan
from services.scheduler.kernels import KernelLoader
from services.scheduler.llama import LlamaModel
from services.scheduler.scheduler import SchedulerOutput


def build_metadata(
    output: SchedulerOutput, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
    """Flattens a step into (input_ids [T], positions [T], metadata, logits_rows [S]).

    ``logits_rows`` holds the row of the last token of each request that samples this step, in the
    order of ``output.scheduled`` (the order :meth:`Scheduler.update` expects tokens in).
    """
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    decode_rows: list[int] = []
    decode_tables: list[list[int]] = []
    decode_lens: list[int] = []
    prefills: list[PrefillSpan] = []
    logits_rows: list[int] = []
    query_start_loc: list[int] = [0]
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    for item in output.scheduled:
        request = item.request
        start = len(input_ids)
        first, end = item.num_computed_tokens, item.num_computed_tokens + item.num_new_tokens
        tokens = request.all_token_ids
        input_ids.extend(tokens[first:end])
        positions.extend(range(first, end))
        blocks = request.block_ids
        slots.extend(
            blocks[p // block_size] * block_size + p % block_size for p in range(first, end)
        )
        num_blocks = -(-end // block_size)
        query_start_loc.append(len(input_ids))
        seq_lens.append(end)
        tables.append(blocks[:num_blocks])
        if item.num_new_tokens == 1:
            decode_rows.append(start)
            decode_tables.append(tables[-1])
            decode_lens.append(end)
        else:
            prefills.append(
                PrefillSpan(
                    start,
                    item.num_new_tokens,
                    end,
                    torch.tensor(blocks[:num_blocks], dtype=torch.int64),
                )
            )
        if item.samples:
            logits_rows.append(start + item.num_new_tokens - 1)
    width = max((len(t) for t in decode_tables), default=0)
    table = _padded(decode_tables, width)
    key_pos = torch.arange(width * block_size)
    mask = key_pos.unsqueeze(0) < torch.tensor(decode_lens, dtype=torch.int64).unsqueeze(1)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        decode_rows=torch.tensor(decode_rows, dtype=torch.int64),
        decode_block_tables=table,
        decode_mask=mask.view(len(decode_tables), 1, 1, width * block_size),
        prefills=tuple(prefills),
        query_start_loc=torch.tensor(query_start_loc, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        block_tables=_padded(tables, max((len(t) for t in tables), default=0)),
    )
    return (
        torch.tensor(input_ids, dtype=torch.int64),
        torch.tensor(positions, dtype=torch.int64),
        meta,
        torch.tensor(logits_rows, dtype=torch.int64),
    )


def _padded(tables: list[list[int]], width: int) -> torch.Tensor:
    """int64 [len(tables), width]: the block tables, each padded with block 0."""
    rows = [t + [0] * (width - len(t)) for t in tables]
    return torch.tensor(rows, dtype=torch.int64).view(len(tables), width)


class ModelRunner:
    """Runs the model on the KV arena for each step."""

    def __init__(
        self,
        model: LlamaModel,
        arena: torch.Tensor,
        block_size: int,
        kernels: KernelLoader | None = None,
    ) -> None:
        """
        Args:
            model: the forward.
            arena: [num_layers, 2, num_blocks, block_size, Hkv, D] mapped KV arena.
            block_size: tokens per block.
            kernels: native kernels (attention), built on the first step if not loaded yet;
                None: the pure-torch reference path.
        """
        self.model = model
        self.block_size = block_size
        self.kernels = kernels
        self.set_arena(arena)

    def set_arena(self, arena: torch.Tensor) -> None:
        """Uses a (new) arena mapping for the KV caches."""
        self.kv_caches = [(arena[i, 0], arena[i, 1]) for i in range(arena.shape[0])]

    def execute(self, output: SchedulerOutput) -> torch.Tensor:
        """Runs one step; returns float32 [S, vocab] logits of the requests that sample."""
        input_ids, positions, meta, logits_rows = build_metadata(output, self.block_size)
        hidden = self.model.forward(input_ids, positions, self.kv_caches, meta, self.kernels)
        if logits_rows.numel() == 0:
            return torch.empty(0, self.model.config.vocab_size)
        return self.model.compute_logits(hidden[logits_rows])
