"""Turns a step's plan into model inputs, runs the forward and returns logits to sample from."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import torch

from zerolayer.common.generation import PositionLogprobs
from zerolayer.scheduler.core.scheduler_output import SchedulerOutput
from zerolayer.scheduler.model.attention import AttentionMetadata
from zerolayer.scheduler.model.cuda_graphs import DecodeGraphs
from zerolayer.scheduler.model.decode_padding import graph_batch_sizes
from zerolayer.scheduler.model.device_inputs import DeviceInputs
from zerolayer.scheduler.model.kernels import NATIVE_DTYPES, KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel
from zerolayer.scheduler.model.logprobs import (
    PromptLogprobsSpan,
    compute_prompt_logprobs,
    prompt_logprobs_spans,
)
from zerolayer.scheduler.model.step_inputs import StepBuffers, StepInputs
from zerolayer.scheduler.model.triton_attention import TRITON_DTYPES, triton_available

log = logging.getLogger(__name__)


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
    """Runs the model on the KV arena for each step, where the arena and the weights are.

    On the CPU a step reads the host buffers directly and uses the native kernels. On a CUDA
    device the host-built inputs (page-locked buffers) are copied into persistent device tensors
    and the forward runs there (attention through Triton); decode-only steps replay CUDA graphs
    once :meth:`capture_graphs` has run.
    """

    def __init__(
        self,
        model: LlamaModel,
        arena: torch.Tensor,
        block_size: int,
        kernels: KernelLoader | None = None,
        buffers: StepBuffers | None = None,
        graph_sizes: Sequence[int] | None = None,
    ) -> None:
        """
        Args:
            model: the forward.
            arena: [num_layers, 2, num_blocks, block_size, Hkv, D] mapped KV arena, on the
                model's device.
            block_size: tokens per block.
            kernels: native kernels (attention), built on the first step if not loaded yet;
                None: the pure-torch reference path. CPU only: not used on a CUDA device.
            buffers: persistent step inputs, sized for the scheduler's limits (None: small
                buffers that grow on the first large steps). On a CUDA device the runner uses
                page-locked buffers of the same capacity instead, unless these are page-locked.
            graph_sizes: batch sizes of the decode CUDA graphs (None: :func:`graph_batch_sizes`
                of the buffers' ``max_seqs``; empty: no graphs). Ignored on the CPU.

        Raises:
            ValueError: the arena is not on the model's device.
        """
        self.model = model
        self.block_size = block_size
        self.device = model.device
        self.buffers = buffers if buffers is not None else StepBuffers(block_size)
        self.device_inputs: DeviceInputs | None = None
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda":
            kernels = None
            self._setup_device(graph_sizes)
        self.kernels = kernels
        self.set_arena(arena)

    def _setup_device(self, graph_sizes: Sequence[int] | None) -> None:
        self._step_done = torch.cuda.Event()
        b = self.buffers
        if not b.pin_memory:
            b = StepBuffers(self.block_size, b.max_tokens, b.max_seqs, b.max_blocks, True)
            self.buffers = b
        reference = self.model.config.needs_reference_attention
        triton = self.model.dtype in TRITON_DTYPES and triton_available() and not reference
        if not triton:
            log.warning(
                "the Triton attention kernel cannot run here (Triton does not import, dtype "
                "%s, or the model soft-caps or windows attention: %s): attention runs the "
                "pure-torch reference and decode steps without CUDA graphs, far slower than the "
                "Triton path",
                self.model.dtype,
                reference,
            )
        self.device_inputs = DeviceInputs(
            self.device, b.max_tokens, b.max_seqs, b.max_blocks, reference_attention=not triton
        )
        sizes = graph_batch_sizes(b.max_seqs) if graph_sizes is None else tuple(graph_sizes)
        if triton and sizes:
            self.graphs = DecodeGraphs(self.model, self.block_size, sizes, b.max_blocks)

    @property
    def attention_backend(self) -> str:
        """Where paged attention runs: "triton" (CUDA), "native" (the csrc kernel, once loaded by
        the first step) or "reference" (pure torch)."""
        if self.device_inputs is not None:
            return "reference" if self.device_inputs.reference_attention else "triton"
        native = self.kernels is not None and self.kernels.loaded
        # NOTE: Gemma 2's soft-capped, windowed attention runs the reference (paged_attention).
        native = native and not self.model.config.needs_reference_attention
        return "native" if native and self.model.dtype in NATIVE_DTYPES else "reference"

    @property
    def num_cuda_graphs(self) -> int:
        """Decode CUDA graphs captured now (0 before :meth:`capture_graphs` or without any)."""
        graphs = self.graphs
        return len(graphs.batch_sizes) if graphs is not None and graphs.captured else 0

    def set_arena(self, arena: torch.Tensor) -> None:
        """Uses a (new) arena mapping for the KV caches. Graphs captured over the previous arena
        are captured again over this one; if that fails, steps run eagerly (logged).

        Raises:
            ValueError: the arena is not on the model's device.
        """
        if arena.device != self.device:
            raise ValueError(f"the KV arena is on {arena.device}, the model on {self.device}")
        self.kv_caches = [(arena[i, 0], arena[i, 1]) for i in range(arena.shape[0])]
        if self.graphs is not None and self.graphs.captured:
            try:
                self.capture_graphs()
            except Exception:  # noqa: BLE001 - eager steps still serve
                log.exception("recapturing the decode CUDA graphs failed; decoding eagerly")

    def capture_graphs(self) -> int:
        """Captures the decode CUDA graphs over the current arena (blocks; writes no KV).

        Returns:
            How many graphs were captured: 0 on the CPU, without Triton, or with no graph sizes.

        Raises:
            RuntimeError: the capture failed (no graph is kept; steps run eagerly).
        """
        if self.graphs is None:
            return 0
        with torch.cuda.device(self.device):
            self.graphs.capture(self.kv_caches)
        return len(self.graphs.batch_sizes)

    def copy_blocks(self, block_copies: Sequence[tuple[int, int]]) -> None:
        """Copies the KV of whole blocks, every layer's K and V, from the first block_id of each
        pair to the second (queued on the device's current stream, after the step before).
        Destinations must be distinct and not among the sources."""
        src = torch.tensor([s for s, _ in block_copies], device=self.device)
        dst = torch.tensor([d for _, d in block_copies], device=self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache.index_copy_(0, dst, k_cache.index_select(0, src))
            v_cache.index_copy_(0, dst, v_cache.index_select(0, src))

    def execute(
        self,
        output: SchedulerOutput,
        prompt_logprobs: dict[str, list[PositionLogprobs]] | None = None,
    ) -> torch.Tensor:
        """Runs one step; returns float32 [S, vocab] logits of the requests that sample, on the
        model's device (on CUDA the step is queued, not finished: reading the logits waits).

        Args:
            prompt_logprobs: when given, filled with the prompt logprobs this step computes, by
                request id (see :mod:`zerolayer.scheduler.model.logprobs`); the requests are
                not modified.
        """
        spans = prompt_logprobs_spans(output) if prompt_logprobs is not None else []
        if self.device_inputs is not None:
            with torch.cuda.device(self.device):
                return self._execute_on_device(output, spans, prompt_logprobs)
        inputs = self.buffers.fill(output)
        hidden = self.model.forward(
            inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, self.kernels
        )
        if spans and prompt_logprobs is not None:
            head = partial(self.model.compute_logits, kernels=self.kernels)
            prompt_logprobs.update(compute_prompt_logprobs(hidden, spans, head))
        if inputs.logits_rows.numel() == 0:
            return torch.empty(0, self.model.config.vocab_size)
        return self.model.compute_logits(hidden[inputs.logits_rows], self.kernels)

    def _execute_on_device(
        self,
        output: SchedulerOutput,
        spans: list[PromptLogprobsSpan],
        prompt_logprobs: dict[str, list[PositionLogprobs]] | None,
    ) -> torch.Tensor:
        # NOTE: the host buffers are page-locked and copied asynchronously, so the previous
        # step must be done with them before they are filled again. It is once its logits were
        # read; this wait then costs nothing, and guards callers that never read them.
        self._step_done.synchronize()
        inputs = self.buffers.fill(output)
        try:
            return self._forward_on_device(inputs, spans, prompt_logprobs)
        finally:
            self._step_done.record()

    def _forward_on_device(
        self,
        inputs: StepInputs,
        spans: list[PromptLogprobsSpan],
        prompt_logprobs: dict[str, list[PositionLogprobs]] | None,
    ) -> torch.Tensor:
        # NOTE: graphs keep only the sampled rows' logits; prompt logprobs need hidden states.
        if self.graphs is not None and not spans:
            logits = self.graphs.replay(inputs)
            if logits is not None:
                return logits
        d = self.device_inputs.copy(inputs)  # type: ignore[union-attr]
        hidden = self.model.forward(d.input_ids, d.positions, self.kv_caches, d.meta)
        if spans and prompt_logprobs is not None:
            prompt_logprobs.update(
                compute_prompt_logprobs(hidden, spans, self.model.compute_logits)
            )
        if d.logits_rows.numel() == 0:
            return torch.empty(0, self.model.config.vocab_size, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, d.logits_rows))
