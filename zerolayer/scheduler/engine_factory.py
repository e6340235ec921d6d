"""The one place the engine is assembled, for the scheduler process, the benchmarks and the tests.

They differ only in what they hand over (:class:`EngineParts`: the model's config and weight
tensors, the block allocator, the KV arena and its layout, the device; :class:`EngineConfig`:
the limits and the attention backend; a metrics registry or none). The Llama forward, the
attention kernels, the step buffers, the model runner, the KV cache manager, the scheduler, the
sampler, the metrics and the engine are made here, the same way for all of them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch
from prometheus_client import CollectorRegistry

from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.common.config import EngineSettings, check_settings, documented
from zerolayer.common.device import Device
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.core.kv_cache_manager import BlockAllocator, KVCacheManager
from zerolayer.scheduler.core.scheduler import Scheduler, SchedulingPolicy
from zerolayer.scheduler.metrics import SchedulerGauges, SchedulerMetrics
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel
from zerolayer.scheduler.model.model_runner import ModelRunner
from zerolayer.scheduler.model.native.paths import KernelPaths
from zerolayer.scheduler.model.sampler import Sampler
from zerolayer.scheduler.model.step_inputs import StepBuffers
from zerolayer.scheduler.model.structured_output import GrammarBackend

log = logging.getLogger(__name__)


@documented
@dataclass(frozen=True, kw_only=True)
class EngineConfig(EngineSettings):
    """The scheduler's engine settings (:class:`EngineSettings`, declared once as its flags) and
    what only benchmarks and tests choose."""

    graph_sizes: tuple[int, ...] | None = None
    """Batch sizes of the decode CUDA graphs; None: ``graph_batch_sizes(max_num_seqs)``; ():
    none. Unused on the CPU."""

    @classmethod
    def of(cls, engine_settings: EngineSettings, **overrides: object) -> EngineConfig:
        """The engine config of a scheduler (or a stack) configured with ``engine_settings``,
        with ``overrides`` replacing fields by name."""
        values = {f.name: getattr(engine_settings, f.name) for f in fields(EngineSettings)}
        return cls(**{**values, **overrides})

    def __post_init__(self) -> None:
        """Checks each setting by its declaration, and batch invariance's need of the native
        attention.

        Raises:
            ValueError: a value no engine could run; the message names the flag or field.
        """
        check_settings(self)
        # NOTE: the reference attention (scaled_dot_product_attention) is not batch invariant;
        # the native kernel computes each output row in a fixed order.
        if self.batch_invariant and self.attention_backend != "native":
            raise ValueError("batch_invariant: needs attention_backend native")


@dataclass(frozen=True)
class EngineParts:
    """What the engine runs on, made by its caller."""

    model_config: ModelConfig
    weights: dict[str, torch.Tensor]
    """The checkpoint's tensors by name, on ``device``; the model reads them in place."""
    allocator: BlockAllocator
    """The block pool: the kvstore's client, or an in-process pool."""
    arena: torch.Tensor
    """The KV arena, ``layout.shape`` in the model's dtype, on ``device``."""
    layout: ArenaLayout
    """The arena's geometry (its ``block_size`` is the engine's)."""
    device: Device
    """Where the weights and the arena are and the forward runs."""
    tokenizer_json: str = ""
    """The model's tokenizer.json, for structured output; empty: constrained requests are
    refused."""
    quant_types: Mapping[str, str] | None = None
    """A GGUF checkpoint's tensor types by name (``MappedWeights.quant_types``); None for other
    checkpoints."""


def assemble_engine(
    parts: EngineParts, config: EngineConfig, registry: CollectorRegistry | None = None
) -> Engine:
    """Builds the engine over ``parts`` (not started). Blocking: the first use of the native
    kernel on a machine builds it (about a minute on 2 cores).

    Args:
        registry: where the engine's metrics go (:class:`SchedulerMetrics`); None: no metrics.

    Raises:
        ValueError: the arena's layout does not match the model (layers, KV heads, head size),
            the arena is not of the layout's shape, or the weights or the arena are not on
            ``parts.device`` (or a weight's shape does not match the config, from LlamaModel).
        KeyError: a weight is missing.
    """
    _check_arena(parts)
    model = LlamaModel(parts.model_config, parts.weights, parts.quant_types)
    if model.device != torch.device(str(parts.device)):
        raise ValueError(
            f"the weights are on {model.device}, the engine's device is {parts.device}"
        )
    runner = _model_runner(model, parts, config)
    scheduler = _scheduler(parts, config)
    metrics = None if registry is None else _metrics(registry, scheduler, config)
    # NOTE: each weight tensor keeps its file mapping alive (torch.frombuffer holds the mmap).
    grammar = None
    if parts.tokenizer_json:
        cfg = parts.model_config
        grammar = GrammarBackend(parts.tokenizer_json, cfg.vocab_size, cfg.eos_token_ids)
    return Engine(scheduler, runner, Sampler(), metrics, grammar)


def _check_arena(parts: EngineParts) -> None:
    layout, model = parts.layout, parts.model_config
    geometry = (layout.num_layers, layout.num_kv_heads, layout.head_dim)
    expected = (model.num_hidden_layers, model.num_key_value_heads, model.head_dim)
    if geometry != expected:
        raise ValueError(
            f"the KV arena's (layers, KV heads, head dim) are {geometry}, the model's {expected}"
        )
    if tuple(parts.arena.shape) != layout.shape:
        raise ValueError(f"the KV arena is {tuple(parts.arena.shape)}, its layout {layout.shape}")


def _model_runner(model: LlamaModel, parts: EngineParts, config: EngineConfig) -> ModelRunner:
    block_size = parts.layout.block_size
    # The csrc kernels are CPU code: on a GPU attention goes through Triton (attention.py).
    native = config.attention_backend == "native" and not parts.device.is_cuda
    invariant = config.batch_invariant and native
    kernels = KernelLoader(enabled=native, batch_invariant=invariant)
    module = kernels.load() if native else None
    if native and module is None:
        log.warning(
            "native kernels unavailable (%s): using the reference path%s",
            kernels.unavailable_reason,
            ", NOT batch invariant" if invariant else "",
        )
    if module is not None:
        paths = KernelPaths.of(module, parts.model_config.int8_group_size)
        log.info("native kernels: %s", paths.describe())
        for fallback in paths.fallbacks():
            log.warning("native kernels: %s", fallback)
    if config.batch_invariant and parts.device.is_cuda:
        log.warning("--batch-invariant applies to the CPU forward only; the CUDA path is not")
    if invariant and parts.model_config.needs_reference_attention:
        log.warning(
            "--batch-invariant: this model's attention (soft-capped or windowed, Gemma 2) runs "
            "the reference path, NOT batch invariant"
        )
    buffers = StepBuffers(
        block_size,
        max_tokens=config.max_num_batched_tokens,
        max_seqs=config.max_num_seqs,
        max_blocks=-(-parts.model_config.max_model_len // block_size),
    )
    return ModelRunner(
        model,
        parts.arena,
        block_size,
        kernels=kernels,
        buffers=buffers,
        graph_sizes=config.graph_sizes,
    )


def _scheduler(parts: EngineParts, config: EngineConfig) -> Scheduler:
    policy = SchedulingPolicy(
        config.max_num_seqs,
        config.max_num_batched_tokens,
        parts.model_config.max_model_len,
        kv_unavailable_timeout_s=config.kv_unavailable_timeout_s,
    )
    kv = KVCacheManager(parts.allocator, parts.layout.block_size)
    return Scheduler(policy, kv, parts.model_config.eos_token_ids)


def _metrics(
    registry: CollectorRegistry, scheduler: Scheduler, config: EngineConfig
) -> SchedulerMetrics:
    kv = scheduler.kv
    gauges = SchedulerGauges(
        num_running=lambda: scheduler.num_running,
        num_waiting=lambda: scheduler.num_waiting,
        num_blocks_held=lambda: kv.num_blocks_held,
        num_blocks_in_use=lambda: kv.num_blocks_in_use,
        num_blocks_total=lambda: kv.num_blocks_total,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
    return SchedulerMetrics(registry, gauges)
