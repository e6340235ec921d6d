"""Token-for-token parity of the whole engine (scheduler, paged KV, Llama forward, greedy sampler)
with transformers' LlamaForCausalLM.generate on tiny seeded float32 dummy checkpoints.

Four prompts of different lengths run together, with a token budget that forces chunked prefill,
and in one variant an arena small enough to force recompute preemption.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from factories import MAX_NEW_TOKENS, hf_generate, run_engine
from safetensors.torch import load_file, save_file

from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.common.generation import FinishReason, RequestOutput
from zerolayer.kvstore.in_process import LocalBlockAllocator
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.engine_factory import EngineConfig

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
PROMPT_LENGTHS = (5, 11, 17, 3)
LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that with head_dim 16 some frequencies are scaled, some smoothed, some kept.
    "original_max_position_embeddings": 32,
}


def make_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, PRESET.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def make_model_dir(out_dir: Path, variant: str) -> Path:
    """A dummy checkpoint: "default", "llama3" (rope scaling) or "tied" (no lm_head.weight)."""
    write_dummy_model(out_dir, PRESET, seed=3)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    if variant == "llama3":
        config["rope_scaling"] = LLAMA3_ROPE_SCALING
    elif variant == "tied":
        config["tie_word_embeddings"] = True
        weights_path = out_dir / "model.safetensors"
        tensors = load_file(weights_path)
        del tensors["lm_head.weight"]
        save_file(tensors, str(weights_path), metadata={"format": "pt"})
    config_path.write_text(json.dumps(config, indent=2))
    return out_dir


def make_engine(
    model_dir: Path, num_blocks: int, max_num_batched_tokens: int
) -> tuple[Engine, LocalBlockAllocator]:
    """The engine as the scheduler process builds it (pure-torch attention), over an in-process
    pool and arena of ``num_blocks`` blocks."""
    model = LocalModel.load(model_dir)
    config = EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=max_num_batched_tokens, attention_backend="reference"
    )
    return build_local_engine(model, config, model.arena_layout_of_blocks(BLOCK_SIZE, num_blocks))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        variant: make_model_dir(tmp_path_factory.mktemp(variant), variant)
        for variant in ("default", "llama3", "tied")
    }


@pytest.fixture(scope="module")
def references(model_dirs: dict[str, Path], prompts: list[list[int]]) -> dict[str, list[list[int]]]:
    return {variant: hf_generate(path, prompts) for variant, path in model_dirs.items()}


def assert_matches(
    outputs: dict[str, list[RequestOutput]],
    expected: list[list[int]],
    prompts: list[list[int]],
) -> None:
    for i, reference in enumerate(expected):
        results = outputs[str(i)]
        assert len(reference) == MAX_NEW_TOKENS
        assert [t for r in results for t in r.new_token_ids] == reference, f"request {i}"
        assert [r.finish_reason for r in results] == [FinishReason.UNSPECIFIED] * (
            MAX_NEW_TOKENS - 1
        ) + [FinishReason.LENGTH]
        assert {r.num_prompt_tokens for r in results} == {len(prompts[i])}


def assert_all_free(engine: Engine, allocator: LocalBlockAllocator) -> None:
    assert allocator.num_free_blocks == allocator.num_blocks_total
    assert engine.stats().num_blocks_held == 0
    assert engine.num_streams == 0


@pytest.mark.parametrize(
    ("num_blocks", "max_num_batched_tokens", "preempts"),
    [
        (64, 8, False),  # chunked prefill: the 11- and 17-token prompts take several steps
        (14, 8, True),  # the four requests need 33 blocks at the end: recompute preemption
        (64, 3, False),  # a budget below the running set: decodes wait their turn
    ],
    ids=["chunked", "preempting", "tiny-budget"],
)
def test_engine_matches_transformers_greedy(
    model_dirs: dict[str, Path],
    references: dict[str, list[list[int]]],
    prompts: list[list[int]],
    num_blocks: int,
    max_num_batched_tokens: int,
    preempts: bool,
) -> None:
    engine, allocator = make_engine(model_dirs["default"], num_blocks, max_num_batched_tokens)
    outputs = run_engine(engine, prompts)
    assert_matches(outputs, references["default"], prompts)
    assert (engine.scheduler.num_preemptions > 0) is preempts
    assert_all_free(engine, allocator)
    stats = engine.stats()  # no kernels given: the pure-torch path, and no graphs on the CPU
    assert (stats.attention_backend, stats.num_cuda_graphs) == ("reference", 0)


def test_llama3_rope_scaling_matches_transformers(
    model_dirs: dict[str, Path], references: dict[str, list[list[int]]], prompts: list[list[int]]
) -> None:
    config = ModelConfig.from_json((model_dirs["llama3"] / "config.json").read_text())
    assert config.rope.rope_type == "llama3"
    assert references["llama3"] != references["default"]
    engine, allocator = make_engine(model_dirs["llama3"], 14, 8)
    outputs = run_engine(engine, prompts)
    assert_matches(outputs, references["llama3"], prompts)
    assert engine.scheduler.num_preemptions > 0
    assert_all_free(engine, allocator)


def test_tied_embeddings_match_transformers(
    model_dirs: dict[str, Path], references: dict[str, list[list[int]]], prompts: list[list[int]]
) -> None:
    manifest = read_checkpoint(model_dirs["tied"])
    assert "lm_head.weight" not in {t.name for t in manifest.tensors}
    engine, allocator = make_engine(model_dirs["tied"], 64, 8)
    assert engine.runner.model.lm_head is engine.runner.model.embed_tokens
    outputs = run_engine(engine, prompts)
    assert_matches(outputs, references["tied"], prompts)
    assert_all_free(engine, allocator)


def shard_model_dir(model_dir: Path, out_dir: Path, num_shards: int) -> Path:
    """A copy of ``model_dir`` whose weights are split over ``num_shards`` files with an index,
    as transformers' ``save_pretrained(max_shard_size=...)`` writes them."""
    shutil.copytree(model_dir, out_dir)
    (out_dir / "model.safetensors").unlink()
    tensors = load_file(model_dir / "model.safetensors")
    weight_map = {}
    for shard in range(num_shards):
        file_name = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        names = sorted(tensors)[shard::num_shards]
        save_file({n: tensors[n] for n in names}, str(out_dir / file_name))
        weight_map.update(dict.fromkeys(names, file_name))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    return out_dir


def test_sharded_checkpoint_matches_the_unsharded_one(
    model_dirs: dict[str, Path],
    references: dict[str, list[list[int]]],
    prompts: list[list[int]],
    tmp_path: Path,
) -> None:
    sharded = shard_model_dir(model_dirs["default"], tmp_path / "sharded", 3)
    manifest = read_checkpoint(sharded)
    assert [Path(f).name for f in manifest.files] == [
        f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)
    ]
    assert {t.file_index for t in manifest.tensors} == {0, 1, 2}
    engine, allocator = make_engine(sharded, 64, 8)
    outputs = run_engine(engine, prompts)
    assert_matches(outputs, references["default"], prompts)
    assert_all_free(engine, allocator)
