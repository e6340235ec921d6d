"""Persistent input buffers of the model: each step's token ids, positions, slot mapping and block
tables are written in place into tensors allocated once, not rebuilt from Python lists.

The tensors share memory with numpy views (``torch.from_numpy``), so filling them is numpy slice
assignment; the step then hands the model contiguous leading views of the buffers (the same
approach as vLLM's persistent input batch). Buffers grow (rarely: only when a step exceeds every
earlier one) and never shrink.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from zerolayer.common.settings import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from zerolayer.scheduler.core.scheduler_output import SchedulerOutput
from zerolayer.scheduler.model.attention import AttentionMetadata, PrefillSpan


@dataclass(frozen=True)
class StepInputs:
    """The model inputs of one step (views into :class:`StepBuffers`, valid until its next fill)."""

    input_ids: torch.Tensor
    """int64 [T]: the step's tokens, requests in scheduling order."""
    positions: torch.Tensor
    """int64 [T]: absolute position of each token in its sequence."""
    meta: AttentionMetadata
    logits_rows: torch.Tensor
    """int64 [S]: row of the last token of each request that samples, in scheduling order."""


def _buffer(size: int, pin_memory: bool = False) -> tuple[np.ndarray, torch.Tensor]:
    """A zeroed int64 buffer as (numpy view, tensor) sharing memory; page-locked when asked."""
    if pin_memory:
        tensor = torch.zeros(size, dtype=torch.int64, pin_memory=True)
        return tensor.numpy(), tensor
    array = np.zeros(size, dtype=np.int64)
    return array, torch.from_numpy(array)


class StepBuffers:
    """Owns the persistent input tensors; not thread-safe (the engine thread fills them)."""

    def __init__(
        self,
        block_size: int,
        max_tokens: int = MAX_NUM_BATCHED_TOKENS.default,
        max_seqs: int = MAX_NUM_SEQS.default,
        max_blocks: int = 64,
        pin_memory: bool = False,
    ) -> None:
        """
        Args:
            block_size: tokens per KV block.
            max_tokens: initial capacity in tokens per step (the token budget; by default
                ``--max-num-batched-tokens``' default).
            max_seqs: initial capacity in sequences per step (by default ``--max-num-seqs``').
            max_blocks: initial capacity in blocks per block table (context length / block size).
            pin_memory: page-locked buffers (needs CUDA), so that the tensors the model reads on a
                GPU copy to it asynchronously (``non_blocking``). The caller must not fill again
                before the device has consumed the previous step's copies.
        """
        self.block_size = block_size
        self.pin_memory = pin_memory
        self._allocate(max_tokens, max_seqs, max_blocks)

    def _allocate(self, max_tokens: int, max_seqs: int, max_blocks: int) -> None:
        self.max_tokens, self.max_seqs, self.max_blocks = max_tokens, max_seqs, max_blocks
        pin = self.pin_memory
        self._ids, self.input_ids = _buffer(max_tokens, pin)
        self._pos, self.positions = _buffer(max_tokens, pin)
        self._slots, self.slot_mapping = _buffer(max_tokens, pin)
        self._arange = np.arange(max_blocks * self.block_size, dtype=np.int64)
        self.key_positions = torch.from_numpy(self._arange)
        self._qsl, self.query_start_loc = _buffer(max_seqs + 1, pin)
        self._seq_lens, self.seq_lens = _buffer(max_seqs, pin)
        self._rows, self.logits_rows = _buffer(max_seqs, pin)
        self._decode_rows, self.decode_rows = _buffer(max_seqs)
        self._decode_lens, self.decode_lens = _buffer(max_seqs)
        self._tables, self.block_tables = _buffer(max_seqs * max_blocks, pin)
        self._decode_tables, self.decode_block_tables = _buffer(max_seqs * max_blocks)
        self.decode_mask = torch.zeros(max_seqs * max_blocks * self.block_size, dtype=torch.bool)

    def _reserve(self, output: SchedulerOutput) -> None:
        """Grows the buffers when ``output`` does not fit them."""
        tokens = sum(item.num_new_tokens for item in output.scheduled)
        seqs = len(output.scheduled)
        blocks = max(
            (
                -(-(item.num_computed_tokens + item.num_new_tokens) // self.block_size)
                for item in output.scheduled
            ),
            default=0,
        )
        if tokens > self.max_tokens or seqs > self.max_seqs or blocks > self.max_blocks:
            self._allocate(
                max(tokens, self.max_tokens), max(seqs, self.max_seqs), max(blocks, self.max_blocks)
            )

    def fill(self, output: SchedulerOutput) -> StepInputs:
        """Writes ``output``'s tokens, positions, slots and block tables; returns views of them.

        The returned tensors alias the buffers: they are overwritten by the next ``fill``.
        """
        self._reserve(output)
        bs = self.block_size
        scheduled = output.scheduled
        width = decode_width = num_decodes_total = 0
        for s in scheduled:
            blocks_needed = -(-(s.num_computed_tokens + s.num_new_tokens) // bs)
            width = max(width, blocks_needed)
            if s.num_new_tokens == 1:
                decode_width = max(decode_width, blocks_needed)
                num_decodes_total += 1
        tables = self._tables[: len(scheduled) * width].reshape(len(scheduled), width)
        tables.fill(0)
        decode_tables = self._decode_tables[: num_decodes_total * decode_width].reshape(
            num_decodes_total, decode_width
        )
        decode_tables.fill(0)
        prefills: list[PrefillSpan] = []
        num_tokens = num_samples = num_decodes = 0
        self._qsl[0] = 0
        for i, item in enumerate(scheduled):
            request = item.request
            first, n = item.num_computed_tokens, item.num_new_tokens
            end = first + n
            num_blocks = -(-end // bs)
            blocks = request.block_ids
            tables[i, :num_blocks] = blocks[:num_blocks]
            stop = num_tokens + n
            if n == 1:
                self._ids[num_tokens] = request.token_at(first)
                self._pos[num_tokens] = first
                self._slots[num_tokens] = blocks[first // bs] * bs + first % bs
                self._decode_rows[num_decodes] = num_tokens
                self._decode_lens[num_decodes] = end
                decode_tables[num_decodes, :num_blocks] = tables[i, :num_blocks]
                num_decodes += 1
            else:
                self._ids[num_tokens:stop] = request.token_slice(first, end)
                positions = self._pos[num_tokens:stop]
                positions[:] = self._arange[first:end]
                row = tables[i]
                self._slots[num_tokens:stop] = row[positions // bs] * bs + positions % bs
                row_start = i * width
                prefills.append(
                    PrefillSpan(
                        num_tokens, n, end, self.block_tables[row_start : row_start + num_blocks]
                    )
                )
            self._seq_lens[i] = end
            if item.samples:
                self._rows[num_samples] = stop - 1
                num_samples += 1
            num_tokens = stop
            self._qsl[i + 1] = num_tokens
        span = decode_width * bs
        mask = self.decode_mask[: num_decodes * span].view(num_decodes, span)
        torch.lt(
            self.key_positions[:span].unsqueeze(0),
            self.decode_lens[:num_decodes].unsqueeze(1),
            out=mask,
        )
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:num_tokens],
            decode_rows=self.decode_rows[:num_decodes],
            decode_block_tables=self.decode_block_tables[: num_decodes * decode_width].view(
                num_decodes, decode_width
            ),
            decode_mask=mask.view(num_decodes, 1, 1, span),
            prefills=tuple(prefills),
            query_start_loc=self.query_start_loc[: len(scheduled) + 1],
            seq_lens=self.seq_lens[: len(scheduled)],
            block_tables=self.block_tables[: len(scheduled) * width].view(len(scheduled), width),
        )
        return StepInputs(
            input_ids=self.input_ids[:num_tokens],
            positions=self.positions[:num_tokens],
            meta=meta,
            logits_rows=self.logits_rows[:num_samples],
        )
