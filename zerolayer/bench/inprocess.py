"""The engine as a library: the scheduler process's Engine built in this process, without gRPC.

The same Scheduler, KVCacheManager, ModelRunner, LlamaModel over the same mapped weights, the
same sampler and metrics; only the kvstore is replaced by the in-process block pool
(:class:`LocalBlockAllocator`) and the shared-memory arena by a tensor of the same layout.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from zerolayer.bench.streams import TokenTimes
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dtypes import torch_dtype
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.common.clients import model_dtype_name
from zerolayer.common.config import DEFAULT_BLOCK_SIZE
from zerolayer.common.generation import EngineRequest, RequestOutput, SamplingParams
from zerolayer.kv.arena_layout import ArenaLayout, blocks_for_bytes
from zerolayer.kvstore.in_process import LocalBlockAllocator, local_arena
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.core.engine_commands import Sink
from zerolayer.scheduler.core.kv_cache_manager import KVCacheManager
from zerolayer.scheduler.core.scheduler import Scheduler, SchedulingPolicy
from zerolayer.scheduler.metrics import SchedulerMetrics
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel
from zerolayer.scheduler.model.model_runner import ModelRunner
from zerolayer.scheduler.model.sampler import Sampler
from zerolayer.scheduler.model.weights import MappedWeights


def build_local_engine(
    model_dir: Path,
    kv_cache_bytes: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 512,
) -> Engine:
    """Assembles the engine as ``zerolayer.scheduler`` does, sized like the kvstore's arena
    (whole blocks of ``kv_cache_bytes``), with the scheduler's default limits. Not started."""
    manifest = read_checkpoint(model_dir)
    config = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
    # NOTE: each mapped tensor keeps its file mapping alive, so MappedWeights may go out of scope.
    model = LlamaModel(config, MappedWeights(manifest).tensors)
    shape = ArenaLayout(
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        block_size=block_size,
        dtype=model_dtype_name(manifest),
        num_blocks=0,
    )
    layout = dataclasses.replace(shape, num_blocks=blocks_for_bytes(kv_cache_bytes, shape))
    # The same attention backend the scheduler uses by default (the native kernel).
    kernels = KernelLoader()
    kernels.load()
    runner = ModelRunner(
        model, local_arena(layout, torch_dtype(layout.dtype)), block_size, kernels=kernels
    )
    kv = KVCacheManager(LocalBlockAllocator(layout.num_blocks, block_size), block_size)
    policy = SchedulingPolicy(max_num_seqs, max_num_batched_tokens, config.max_position_embeddings)
    scheduler = Scheduler(policy, kv, config.eos_token_ids)

    def gauges() -> dict[str, float]:
        return {
            "requests_running": len(scheduler.running),
            "requests_waiting": len(scheduler.waiting),
            "kv_blocks_held": kv.num_blocks_held,
        }

    return Engine(scheduler, runner, Sampler(), SchedulerMetrics(CollectorRegistry(), gauges))


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
