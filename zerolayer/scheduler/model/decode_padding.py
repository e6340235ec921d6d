"""Decode batches padded to the batch sizes CUDA graphs are captured at (pure host-side logic).

A captured graph replays fixed shapes, so a decode step of ``n`` sequences runs the graph of the
smallest captured batch size ``b >= n`` (its bucket) with ``b - n`` padding rows. A padding row
belongs to no sequence: it has no queries (``query_start_loc`` stays at ``n``) and ``seq_len`` 0,
so attention reads nothing for it and returns zeros for its row (see
:func:`zerolayer.scheduler.model.triton_attention.paged_attention_triton`). Its token (id 0
at position 0) still runs through every layer, and the layers still write its K and V into the
cache at its slot, so that slot must be one no sequence reads before writing it again:

NOTE: the padding slot is the slot right after the token of a sequence in this very step, in the
same block (:func:`padding_slot`). The block holding a sequence's newest token is its own: prefix
caching shares only full, committed blocks, and a lookup never covers the token being computed,
so the block was allocated to this sequence alone and is not full yet. Attention this step reads
the sequence's keys up to that token only, and the next step writes the following position before
reading it; a freed partial block is never committed (only full blocks are), so whoever gets it
next writes before reading too. When every sequence's token is the last of its block there is no
such slot, and the step runs eagerly instead (no padding, no graph). The KV arena's blocks all
belong to the kvstore's pool (block 0 included), so no slot is reserved for padding there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from zerolayer.scheduler.model.step_inputs import StepInputs

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
"""Batch sizes decode graphs are captured at (capped at ``max_num_seqs``, see
:func:`graph_batch_sizes`); larger decode batches run eagerly."""

SECTIONS = ("input_ids", "positions", "slot_mapping", "seq_lens", "logits_rows", "query_start_loc")
"""The int64 inputs of a decode graph, in their order in :class:`DecodeStaging`'s buffer."""


def graph_batch_sizes(
    max_num_seqs: int, sizes: Sequence[int] = GRAPH_BATCH_SIZES
) -> tuple[int, ...]:
    """The sizes of ``sizes`` below ``max_num_seqs``, then the cap itself (``min(max_num_seqs,
    max(sizes))``), ascending: ``graph_batch_sizes(48) == (1, 2, 4, 8, 16, 32, 48)``.

    Raises:
        ValueError: ``max_num_seqs`` is below 1 or ``sizes`` is empty.
    """
    if max_num_seqs < 1 or not sizes:
        raise ValueError(f"need max_num_seqs >= 1 and sizes, got {max_num_seqs}, {sizes}")
    cap = min(max_num_seqs, max(sizes))
    return tuple(sorted({s for s in sizes if s < cap} | {cap}))


def bucket_for(num_seqs: int, batch_sizes: Sequence[int]) -> int | None:
    """The smallest of ``batch_sizes`` (ascending) holding ``num_seqs`` sequences; None when
    ``num_seqs`` is above them all (the step runs eagerly)."""
    for size in batch_sizes:
        if size >= num_seqs:
            return size
    return None


def is_decode_only(inputs: StepInputs) -> bool:
    """True when every sequence of the step is fed exactly one token (and there is one)."""
    num_seqs = inputs.meta.seq_lens.shape[0]
    return num_seqs > 0 and inputs.input_ids.shape[0] == num_seqs


def padding_slot(inputs: StepInputs, block_size: int) -> int | None:
    """A cache slot padding rows may write to in a decode-only step (see the module note): the
    slot after the first token that is not the last of its block; None when there is none."""
    positions = inputs.positions.numpy()
    candidates = np.flatnonzero((positions + 1) % block_size)
    if candidates.size == 0:
        return None
    return int(inputs.meta.slot_mapping[int(candidates[0])]) + 1


class DecodeStaging:
    """The host image of a decode graph's int64 inputs, in one buffer so one copy moves them.

    The buffer holds, for graphs of up to ``max_batch`` rows, the sections of :data:`SECTIONS`:
    ``max_batch`` entries each, and ``max_batch + 1`` for ``query_start_loc`` (last). The device
    copy of the buffer has the same layout, so :meth:`views` cuts either into the graph's inputs.
    """

    def __init__(self, max_batch: int, pin_memory: bool = False) -> None:
        """``pin_memory``: page-locked (needs CUDA), for asynchronous copies to the device."""
        self.max_batch = max_batch
        self.buffer = torch.zeros(
            len(SECTIONS) * max_batch + 1, dtype=torch.int64, pin_memory=pin_memory
        )

    def views(self, buffer: torch.Tensor, batch: int) -> dict[str, torch.Tensor]:
        """The sections of ``buffer`` (this layout) for a graph of ``batch`` rows, by name:
        [batch] each, ``query_start_loc`` [batch + 1]; contiguous views, not copies."""
        b = self.max_batch
        out = {name: buffer[i * b : i * b + batch] for i, name in enumerate(SECTIONS)}
        qsl_start = (len(SECTIONS) - 1) * b
        out["query_start_loc"] = buffer[qsl_start : qsl_start + batch + 1]
        return out

    def write(self, inputs: StepInputs, batch: int, pad_slot: int) -> None:
        """Writes a decode-only step of ``n <= batch`` sequences, padded to ``batch`` rows.

        Rows ``[n, batch)`` get token 0 at position 0, slot ``pad_slot``, ``seq_len`` 0 and no
        queries (``query_start_loc`` stays ``n`` after index ``n``); ``logits_rows`` are the
        step's.
        Entries past ``batch`` are left as they were (no graph of this batch reads them).
        """
        n = inputs.input_ids.shape[0]
        meta = inputs.meta
        s = self.views(self.buffer, batch)
        for name, source, pad in (
            ("input_ids", inputs.input_ids, 0),
            ("positions", inputs.positions, 0),
            ("slot_mapping", meta.slot_mapping, pad_slot),
            ("seq_lens", meta.seq_lens, 0),
        ):
            array = s[name].numpy()
            array[:n] = source.numpy()
            array[n:] = pad
        num_samples = inputs.logits_rows.shape[0]
        s["logits_rows"].numpy()[:num_samples] = inputs.logits_rows.numpy()
        qsl = s["query_start_loc"].numpy()
        qsl[: n + 1] = meta.query_start_loc.numpy()
        qsl[n + 1 :] = n

    def write_capture(self, batch: int) -> None:
        """Inputs for capturing (and warming up) the graph of ``batch`` rows: every row is one
        token (id 0, position 0, slot 0) of its own sequence of length 1, sampled."""
        s = self.views(self.buffer, batch)
        for name in ("input_ids", "positions", "slot_mapping"):
            s[name].zero_()
        s["seq_lens"].fill_(1)
        s["logits_rows"].copy_(torch.arange(batch))
        s["query_start_loc"].copy_(torch.arange(batch + 1))
