"""The engine as a library: the scheduler process's Engine built in this process, without gRPC.

The same engine factory (:func:`zerolayer.scheduler.engine_factory.assemble_engine`) builds it,
over the same mapped weights; only the kvstore is replaced by the in-process block pool
(:class:`LocalBlockAllocator`) and the shared-memory arena by a local tensor of the layout the
kvstore would give it (:func:`zerolayer.kv.arena_layout.model_arena_layout`). Benchmarks and
tests build their in-process engines here.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry

from zerolayer.bench.streams import TokenTimes
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dtypes import torch_dtype
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.common.device import CPU, Device, resolve_device
from zerolayer.common.generation import EngineRequest, RequestOutput, SamplingParams
from zerolayer.kv.arena_layout import ArenaLayout, model_arena_layout
from zerolayer.kvstore.in_process import LocalBlockAllocator, local_arena
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.core.engine_commands import Sink
from zerolayer.scheduler.engine_factory import EngineConfig, EngineParts, assemble_engine
from zerolayer.scheduler.model.weights import MappedWeights
from zerolayer.sharing.manifest import WeightManifest
from zerolayer.stack.config import StackConfig


@dataclass(frozen=True)
class LocalModel:
    """A checkpoint read in this process: its manifest, config and weight tensors on ``device``
    (mapped read-only from its files on the CPU; copied onto a CUDA device)."""

    manifest: WeightManifest
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    device: Device
    quant_types: Mapping[str, str] | None = None
    """A GGUF checkpoint's tensor types by name; None for other checkpoints."""

    @classmethod
    def load(cls, model_dir: Path, device: Device = CPU, dtype: str = "auto") -> LocalModel:
        """Reads the checkpoint in ``model_dir`` (safetensors or GGUF; never a pickle);
        ``dtype``: ``--dtype``, a GGUF file's compute dtype.

        Raises:
            ValueError / OSError: the directory is not a readable checkpoint.
        """
        manifest = read_checkpoint(model_dir, dtype=dtype)
        config = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
        # NOTE: each mapped tensor keeps its file mapping alive, so MappedWeights may go.
        mapped = MappedWeights(manifest)
        weights = mapped.tensors
        if device.is_cuda:
            weights = {name: t.to(str(device)) for name, t in weights.items()}
        return cls(manifest, config, weights, device, mapped.model_quant_types)

    def arena_layout(self, block_size: int, kv_cache_bytes: int) -> ArenaLayout:
        """The arena the kvstore would make for this model: whole blocks of ``block_size`` tokens
        in ``kv_cache_bytes``."""
        return model_arena_layout(self.manifest, block_size, kv_cache_bytes)

    def arena_layout_of_blocks(self, block_size: int, num_blocks: int) -> ArenaLayout:
        """The arena of exactly ``num_blocks`` blocks of ``block_size`` tokens for this model."""
        return dataclasses.replace(self.arena_layout(block_size, 0), num_blocks=num_blocks)


def build_local_engine(
    model: LocalModel,
    config: EngineConfig,
    layout: ArenaLayout,
    *,
    enable_prefix_caching: bool = True,
    registry: CollectorRegistry | None = None,
) -> tuple[Engine, LocalBlockAllocator]:
    """The engine over an in-process block pool and a zeroed local arena of ``layout`` on the
    model's device, assembled as the scheduler process assembles its own. Not started.

    Args:
        enable_prefix_caching: the pool's prefix cache (as the kvstore's flag).
        registry: where the engine's metrics go; None: no metrics.

    Returns:
        The engine and its block pool (to inspect: free blocks, reference counts, cache stats).

    Raises:
        ValueError: see :func:`assemble_engine`.
    """
    arena = local_arena(layout, torch_dtype(layout.dtype))
    if model.device.is_cuda:
        arena = arena.to(str(model.device))
    allocator = LocalBlockAllocator(layout.num_blocks, layout.block_size, enable_prefix_caching)
    parts = EngineParts(
        model.config,
        model.weights,
        allocator,
        arena,
        layout,
        model.device,
        model.manifest.tokenizer_json,
        model.quant_types,
    )
    return assemble_engine(parts, config, registry), allocator


def local_engine_for_stack(config: StackConfig) -> Engine:
    """The engine a stack started with ``config`` runs in its scheduler process (the same model,
    device, arena size, limits, attention backend and prefix caching), built in this process.
    Not started."""
    device = resolve_device(config.device)
    model = LocalModel.load(Path(config.model_dir), device)
    engine_config = EngineConfig.of(config)
    layout = model.arena_layout(config.block_size, config.kv_cache_bytes)
    engine, _ = build_local_engine(
        model,
        engine_config,
        layout,
        enable_prefix_caching=config.enable_prefix_caching,
        registry=CollectorRegistry(),
    )
    return engine


class LocalEngineClient:
    """Submits requests to a running in-process engine and times their tokens as they leave the
    engine thread (the in-process counterpart of :func:`zerolayer.bench.streams.run_streams`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._ids = itertools.count()

    def run(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, timeout_s: float = 3600
    ) -> list[TokenTimes]:
        """Submits every prompt at once (greedy, EOS ignored) and waits for all to finish.

        Raises:
            Exception: the error one request ended with.
            TimeoutError: not finished within ``timeout_s``.
        """
        arrivals: list[list[float]] = [[] for _ in prompts]
        errors: list[Exception] = []
        remaining = [len(prompts)]
        lock = threading.Lock()
        done = threading.Event()

        def sink_for(i: int) -> Sink:
            def sink(result: RequestOutput | Exception) -> None:
                now = time.perf_counter()
                if isinstance(result, Exception):
                    errors.append(result)
                else:
                    arrivals[i].extend([now] * len(result.new_token_ids))
                if isinstance(result, Exception) or result.finished:
                    with lock:
                        remaining[0] -= 1
                        if remaining[0] == 0:
                            done.set()

            return sink

        sends = []
        for i, prompt in enumerate(prompts):
            request = EngineRequest(
                f"bench-{next(self._ids)}", tuple(prompt), max_new_tokens, SamplingParams(), True
            )
            sends.append(time.perf_counter())
            self.engine.submit(request, sink_for(i))
        if not done.wait(timeout_s):
            raise TimeoutError(f"in-process engine did not finish in {timeout_s} s")
        if errors:
            raise errors[0]
        return [TokenTimes(s, tuple(a)) for s, a in zip(sends, arrivals, strict=True)]
