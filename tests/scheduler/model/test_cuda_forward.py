"""The forward on CUDA (``gpu`` marker; run by scripts/device_check.sh): greedy ids equal to the
CPU path and to transformers on the same seeded float32 dummy checkpoint (cross-device parity is
checked in float32 only: in bfloat16 the Triton kernel rounds the probabilities before P.V and the
CPU kernel does not, so a near tie may flip), decode CUDA graphs replaying the same tokens as the
eager CUDA path at several (padded) batch sizes, and sampling from device logits equal to sampling
from the same logits on the CPU. ``engine_on`` and ``generate`` (tests/factories.py) also give
the GPU stack test (tests/e2e/test_gpu_stack.py) its in-process reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from factories import MAX_NEW_TOKENS, generate, hf_generate, make_engine

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.common.device import resolve_device
from zerolayer.common.generation import SamplingParams
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.model.sampler import Sampler
from zerolayer.scheduler.model.triton_attention import triton_available

PRESET = DummyPreset(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=259,
    max_position_embeddings=256,
    dtype="float32",
)
BLOCK_SIZE = 4
NUM_BLOCKS = 128
MAX_NUM_SEQS = 8

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_triton = pytest.mark.skipif(
    not (torch.cuda.is_available() and triton_available()), reason="needs CUDA and Triton"
)


def make_prompts(num_prompts: int, seed: int = 7) -> list[list[int]]:
    """Prompts of lengths 3, 5, 8, 11, ... so that decodes sit at different block offsets."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3 + (5 * i) % 14 for i in range(num_prompts)]
    return [torch.randint(3, PRESET.vocab_size, (n,), generator=g).tolist() for n in lengths]


def engine_on(
    model_dir: Path,
    device: str,
    graph_sizes: tuple[int, ...] | None = (),
    max_num_batched_tokens: int = 64,
    *,
    block_size: int = BLOCK_SIZE,
    max_num_seqs: int = MAX_NUM_SEQS,
) -> Engine:
    """The engine as the scheduler process builds it, over an in-process pool, with weights and
    arena (in the checkpoint's dtype) on ``device``."""
    model = LocalModel.load(model_dir, resolve_device(device))
    engine, _ = make_engine(
        model,
        NUM_BLOCKS,
        block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        graph_sizes=graph_sizes,
    )
    return engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dummy")
    write_dummy_model(out, PRESET, seed=3)
    return out


@pytest.mark.gpu
@needs_cuda
def test_cuda_greedy_ids_equal_cpu_and_transformers(model_dir: Path) -> None:
    prompts = make_prompts(5)
    cuda_ids = generate(engine_on(model_dir, "cuda"), prompts)
    assert cuda_ids == generate(engine_on(model_dir, "cpu"), prompts)
    assert cuda_ids == hf_generate(model_dir, prompts, "cuda")
    assert all(len(ids) == MAX_NEW_TOKENS for ids in cuda_ids)


@pytest.mark.gpu
@needs_cuda
def test_cuda_chunked_prefill_matches_cpu(model_dir: Path) -> None:
    prompts = make_prompts(4, seed=11)
    cuda_ids = generate(engine_on(model_dir, "cuda", max_num_batched_tokens=6), prompts)
    assert cuda_ids == generate(engine_on(model_dir, "cpu", max_num_batched_tokens=6), prompts)


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("num_prompts", [1, 2, 3, 5, 8])
def test_cuda_graph_replay_gives_the_eager_tokens(model_dir: Path, num_prompts: int) -> None:
    prompts = make_prompts(num_prompts, seed=num_prompts)
    eager = generate(engine_on(model_dir, "cuda"), prompts)
    engine = engine_on(model_dir, "cuda", graph_sizes=None)
    engine.warm_up(8)
    engine.capture_graphs()
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.captured and graphs.batch_sizes == (1, 2, 4, 8)
    stats = engine.stats()
    assert (stats.attention_backend, stats.num_cuda_graphs) == ("triton", 4)
    assert generate(engine, prompts) == eager
    # Decode steps replayed, padded ones (3 -> 4, 5 -> 8) included; a padded step where every
    # token ends its block has no padding slot and runs eagerly.
    assert graphs.num_replays >= MAX_NEW_TOKENS // 2


@pytest.mark.gpu
@needs_triton
def test_graphs_follow_a_new_arena(model_dir: Path) -> None:
    prompts = make_prompts(3, seed=5)
    eager = generate(engine_on(model_dir, "cuda"), prompts)
    engine = engine_on(model_dir, "cuda", graph_sizes=None)
    engine.capture_graphs()
    runner = engine.runner
    k_cache = runner.kv_caches[0][0]
    runner.set_arena(torch.zeros((len(runner.kv_caches), 2, *k_cache.shape), device="cuda"))
    assert runner.graphs is not None and runner.graphs.captured
    assert generate(engine, prompts, tag="after") == eager
    assert runner.graphs.num_replays > 0


@pytest.mark.gpu
@needs_cuda
def test_sampling_device_logits_equals_cpu_logits() -> None:
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.8, top_k=20, seed=1),
        SamplingParams(temperature=1.2, top_p=0.9, seed=2),
        SamplingParams(),
    ]

    seeds, positions = [10, 11, 12, 13], [5, 6, 7, 8]
    on_cpu = Sampler()(logits, params, seeds, positions)
    assert Sampler()(logits.cuda(), params, seeds, positions) == on_cpu
