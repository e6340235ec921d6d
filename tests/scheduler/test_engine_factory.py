"""The engine factory: what it is given reaches the scheduler, the model runner and the metrics
exactly, parts that do not fit together are refused, and the in-process helper sizes its arena
as the kvstore does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.common.config import KVStoreConfig
from zerolayer.common.device import Device
from zerolayer.common.generation import EngineRequest, SamplingParams
from zerolayer.kvstore.in_process import LocalBlockAllocator, local_arena
from zerolayer.kvstore.kv_store import arena_layout
from zerolayer.scheduler.core.scheduler import SchedulingPolicy
from zerolayer.scheduler.engine_factory import EngineConfig, EngineParts, assemble_engine

PRESET = DummyPreset(64, 128, 2, 4, 2, 259, max_position_embeddings=100)
BLOCK_SIZE = 4
CONFIG = EngineConfig(
    max_num_seqs=4,
    max_num_batched_tokens=16,
    kv_unavailable_timeout_s=7.5,
    attention_backend="reference",
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    return LocalModel.load(write_dummy_model(tmp_path_factory.mktemp("dummy"), PRESET, seed=1))


def make_parts(model: LocalModel, num_blocks: int = 8, **changes: object) -> EngineParts:
    layout = model.arena_layout_of_blocks(BLOCK_SIZE, num_blocks)
    allocator = LocalBlockAllocator(num_blocks, BLOCK_SIZE)
    arena = local_arena(layout, torch.float32)
    parts = EngineParts(model.config, model.weights, allocator, arena, layout, Device("cpu"))
    return dataclasses.replace(parts, **changes)


def test_the_limits_reach_the_scheduler_and_the_step_buffers(model: LocalModel) -> None:
    engine = assemble_engine(make_parts(model), CONFIG)
    assert engine.scheduler.policy == SchedulingPolicy(4, 16, 100, kv_unavailable_timeout_s=7.5)
    assert engine.scheduler.eos_token_ids == frozenset(model.config.eos_token_ids)
    assert engine.scheduler.kv.block_size == engine.runner.block_size == BLOCK_SIZE
    buffers = engine.runner.buffers
    assert (buffers.max_tokens, buffers.max_seqs, buffers.max_blocks) == (16, 4, 25)
    assert engine.metrics is None
    assert engine.runner.kv_caches[0][0].shape == (8, BLOCK_SIZE, 2, 16)


def test_the_metrics_read_the_engines_scheduler(model: LocalModel) -> None:
    registry = CollectorRegistry()
    engine = assemble_engine(make_parts(model), CONFIG, registry)
    for i in range(5):  # 6-token prompts
        prompt = tuple(range(10 + i, 16 + i))
        engine.submit(EngineRequest(f"r{i}", prompt, 4, SamplingParams()), lambda _: None)
    engine.process_commands()
    engine.step()  # a budget of 16: r0 and r1 prefill (2 blocks each), r2 its first 4 tokens
    gauges = {
        name: registry.get_sample_value(f"zerolayer_scheduler_{name}")
        for name in ("requests_running", "requests_waiting", "kv_blocks_held")
    }
    assert gauges == {"requests_running": 3, "requests_waiting": 2, "kv_blocks_held": 5}
    assert registry.get_sample_value("zerolayer_scheduler_generated_tokens_total") == 2.0
    assert engine.stats().attention_backend == "reference"


def test_parts_that_do_not_fit_together_are_refused(model: LocalModel) -> None:
    parts = make_parts(model)
    wrong_heads = dataclasses.replace(parts.layout, num_kv_heads=4)
    with pytest.raises(ValueError, match=r"\(layers, KV heads, head dim\) are \(2, 4, 16\), "):
        assemble_engine(dataclasses.replace(parts, layout=wrong_heads), CONFIG)
    with pytest.raises(ValueError, match=r"the KV arena is \(2, 2, 7, 4, 2, 16\), its layout"):
        assemble_engine(dataclasses.replace(parts, arena=parts.arena[:, :, :7]), CONFIG)
    with pytest.raises(ValueError, match="the weights are on cpu, the engine's device is cuda:0"):
        assemble_engine(dataclasses.replace(parts, device=Device("cuda", 0)), CONFIG)


def test_engine_config_refuses_what_no_engine_could_run() -> None:
    with pytest.raises(
        ValueError, match="^--attention-backend: 'triton' is not one of native, reference$"
    ):
        EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, attention_backend="triton")
    with pytest.raises(ValueError, match="^--max-num-seqs: must be > 0$"):
        EngineConfig(max_num_seqs=0, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="^--max-num-batched-tokens: must be > 0$"):
        EngineConfig(max_num_seqs=4, max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="^--kv-unavailable-timeout-s: must be > 0$"):
        EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, kv_unavailable_timeout_s=0.0)
    with pytest.raises(ValueError, match="batch_invariant: needs attention_backend native"):
        EngineConfig(
            max_num_seqs=4,
            max_num_batched_tokens=16,
            attention_backend="reference",
            batch_invariant=True,
        )


def test_the_local_engines_arena_is_the_one_the_kvstore_would_make(
    model: LocalModel, tmp_path: Path
) -> None:
    kv_cache_bytes = 100_000  # 2 layers x K,V x 4 tokens x 2 heads x 16 x 4 bytes: 48 blocks
    kvstore = KVStoreConfig(
        address="unix:x", loader_address="unix:y", shm_path=str(tmp_path / "kv"),
        kv_cache_bytes=kv_cache_bytes, block_size=BLOCK_SIZE,
    )  # fmt: skip
    layout = model.arena_layout(BLOCK_SIZE, kv_cache_bytes)
    assert layout == arena_layout(kvstore, model.manifest)
    assert (layout.num_blocks, layout.dtype) == (48, "F32")
    engine, allocator = build_local_engine(model, CONFIG, layout, enable_prefix_caching=False)
    assert allocator.num_blocks_total == 48 and not allocator.enabled
    assert engine.runner.kv_caches[1][1].shape == (48, BLOCK_SIZE, 2, 16)
    assert engine.runner.kv_caches[1][1].dtype == torch.float32
