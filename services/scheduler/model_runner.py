"""Turns a step's plan into model inputs, runs the forward and returns logits to sample from."""

from __future__ import annotations

import torch

from services.scheduler.attention import AttentionMetadata
from services.scheduler.kernels import KernelLoader
from services.scheduler.llama import LlamaModel
from services.scheduler.scheduler import SchedulerOutput
from services.scheduler.step_inputs import StepBuffers


def build_metadata(
    output: SchedulerOutput, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
    """Flattens a step into (input_ids [T], positions [T], metadata, logits_rows [S]).

    A one-off form of :meth:`StepBuffers.fill` (fresh buffers; tests and benchmarks use it).
    ``logits_rows`` holds the row of the last token of each request that samples this step, in the
    order of ``output.scheduled`` (the order :meth:`Scheduler.update` expects tokens in).
    """
    inputs = StepBuffers(block_size, max_tokens=1, max_seqs=1, max_blocks=1).fill(output)
    return inputs.input_ids, inputs.positions, inputs.meta, inputs.logits_rows


class ModelRunner:
    """Runs the model on the KV arena for each step."""

    def __init__(
        self,
        model: LlamaModel,
        arena: torch.Tensor,
        block_size: int,
        kernels: KernelLoader | None = None,
        buffers: StepBuffers | None = None,
    ) -> None:
        """
        Args:
            model: the forward.
            arena: [num_layers, 2, num_blocks, block_size, Hkv, D] mapped KV arena.
            block_size: tokens per block.
            kernels: native kernels (attention), built on the first step if not loaded yet;
                None: the pure-torch reference path.
            buffers: persistent step inputs, sized for the scheduler's limits (None: small
                buffers that grow on the first large steps).
        """
        self.model = model
        self.block_size = block_size
        self.kernels = kernels
        self.buffers = buffers if buffers is not None else StepBuffers(block_size)
        self.set_arena(arena)

    def set_arena(self, arena: torch.Tensor) -> None:
        """Uses a (new) arena mapping for the KV caches."""
        self.kv_caches = [(arena[i, 0], arena[i, 1]) for i in range(arena.shape[0])]

    def execute(self, output: SchedulerOutput) -> torch.Tensor:
        """Runs one step; returns float32 [S, vocab] logits of the requests that sample."""
        inputs = self.buffers.fill(output)
        hidden = self.model.forward(
            inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, self.kernels
        )
        if inputs.logits_rows.numel() == 0:
            return torch.empty(0, self.model.config.vocab_size)
        return self.model.compute_logits(hidden[inputs.logits_rows], self.kernels)
