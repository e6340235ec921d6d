"""CUDA graphs of the decode forward at bucketed batch sizes: captured once, replayed per step.

A decode step launches a few hundred small kernels whose launch cost, at small batches, exceeds
their run time; a CUDA graph replays the whole forward (every layer, the final norm and the LM
head) with one launch. Each graph reads its inputs from static device tensors; a replay copies
the step's inputs (padded to the graph's batch size, see
:mod:`zerolayer.scheduler.model.decode_padding`) into them, then replays. The attention kernel
sizes its grid from the batch size alone and reads ``seq_lens`` and block tables from device
memory (:mod:`zerolayer.scheduler.model.triton_attention`), so one graph serves every context
length. Graphs are captured largest first into one memory pool (only one replays at a time, so
they share their intermediate buffers), with plain allocations from torch's caching allocator,
never managed memory.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from zerolayer.scheduler.model.attention import AttentionMetadata
from zerolayer.scheduler.model.decode_padding import (
    DecodeStaging,
    bucket_for,
    is_decode_only,
    padding_slot,
)
from zerolayer.scheduler.model.llama import LlamaModel
from zerolayer.scheduler.model.step_inputs import StepInputs

log = logging.getLogger(__name__)

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class DecodeGraphs:
    """The decode graphs of one model on one CUDA device; used by the engine thread only."""

    def __init__(
        self,
        model: LlamaModel,
        block_size: int,
        batch_sizes: Sequence[int],
        max_blocks: int,
    ) -> None:
        """
        Args:
            model: the forward, on a CUDA device (attention through Triton).
            block_size: tokens per KV block.
            batch_sizes: ascending batch sizes to capture (see
                :func:`~zerolayer.scheduler.model.decode_padding.graph_batch_sizes`).
            max_blocks: widest block table a graph takes (context length / block size); wider
                steps run eagerly.
        """
        self.model = model
        self.block_size = block_size
        self.batch_sizes = tuple(batch_sizes)
        device = model.device
        self.staging = DecodeStaging(max(self.batch_sizes), pin_memory=True)
        self.static = torch.zeros_like(self.staging.buffer, device=device)
        self.block_tables = torch.zeros(
            max(self.batch_sizes), max_blocks, dtype=torch.int64, device=device
        )
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = 0
        """Steps that ran as a graph replay (a counter for tests and metrics)."""

    @property
    def captured(self) -> bool:
        """True once :meth:`capture` succeeded (and no :meth:`release` since)."""
        return bool(self._graphs)

    def release(self) -> None:
        """Drops the graphs (their pool's memory goes back to torch's caching allocator); steps
        run eagerly until the next capture."""
        self._graphs.clear()

    def capture(self, kv_caches: KVCaches) -> None:
        """Captures one graph per batch size over ``kv_caches`` (drops earlier graphs first).

        Before each capture the same forward runs once, eagerly, on a one-block scratch cache (so
        kernels compile and libraries initialise outside the capture); the capture itself only
        records, so nothing is written into ``kv_caches``. Blocks until done.

        Raises:
            RuntimeError: capture failed (e.g. out of device memory); no graph is kept.
        """
        self.release()
        k_cache = kv_caches[0][0]
        shape, dtype, device = (1, *k_cache.shape[1:]), k_cache.dtype, k_cache.device
        scratch = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in kv_caches
        ]
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        self.block_tables.zero_()
        try:
            for batch in sorted(self.batch_sizes, reverse=True):
                self.staging.write_capture(batch)
                self.static.copy_(self.staging.buffer)
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self._forward(batch, scratch)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    logits = self._forward(batch, kv_caches)
                self._graphs[batch] = (graph, logits)
        except BaseException:
            self.release()
            raise
        torch.cuda.synchronize()

    def replay(self, inputs: StepInputs) -> torch.Tensor | None:
        """Runs a step as a graph replay when it can: decode-only, at most the largest batch
        size, block tables no wider than the graphs', and, when padded, a padding slot exists.

        ``inputs`` are the step's host tensors (page-locked: they are copied asynchronously, so
        they must stay unchanged until the device has run the step; the sampler's read of the
        logits waits for that).

        Returns:
            float32 [S, vocab] logits of the rows in ``inputs.logits_rows``, on the device, or
            None: run the step eagerly.
        """
        if not self._graphs or not is_decode_only(inputs):
            return None
        num_seqs, width = inputs.meta.block_tables.shape
        batch = bucket_for(num_seqs, self.batch_sizes)
        if batch is None or width > self.block_tables.shape[1]:
            return None
        pad_slot = padding_slot(inputs, self.block_size) if batch > num_seqs else -1
        if pad_slot is None:
            return None
        self.staging.write(inputs, batch, pad_slot)
        self.static.copy_(self.staging.buffer, non_blocking=True)
        self.block_tables[:num_seqs, :width].copy_(inputs.meta.block_tables, non_blocking=True)
        graph, logits = self._graphs[batch]
        graph.replay()
        self.num_replays += 1
        rows = self.staging.views(self.static, batch)["logits_rows"][: inputs.logits_rows.shape[0]]
        return logits.index_select(0, rows)

    def _forward(self, batch: int, kv_caches: KVCaches) -> torch.Tensor:
        """The forward of ``batch`` rows over the static inputs: float32 [batch, vocab] logits."""
        s = self.staging.views(self.static, batch)
        device = self.static.device
        meta = AttentionMetadata(
            slot_mapping=s["slot_mapping"],
            # The decode_* fields and prefills feed only the reference attention; graphs are
            # captured only where the Triton kernel runs (it reads the last three fields).
            decode_rows=torch.empty(0, dtype=torch.int64, device=device),
            decode_block_tables=torch.empty(0, 0, dtype=torch.int64, device=device),
            decode_mask=torch.empty(0, 1, 1, 0, dtype=torch.bool, device=device),
            prefills=(),
            query_start_loc=s["query_start_loc"],
            seq_lens=s["seq_lens"],
            block_tables=self.block_tables[:batch],
        )
        hidden = self.model.forward(s["input_ids"], s["positions"], kv_caches, meta)
        return self.model.compute_logits(hidden)
