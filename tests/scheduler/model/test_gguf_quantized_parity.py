"""Quantized GGUF files (written by the bench's exporter: gguf-py's quantizers and the K-quant one
of benchmarks/llamacpp/gguf_kquants.py) through the engine in process, native kernels, computing
in float32 (``--dtype float32``): the greedy ids of transformers in float32 on the values the
file holds (its weights dequantized), for every family (their rows of 64 and 128 values make
Q4_K_M's tensors fall back to Q5_0 and Q8_0, as llama.cpp's quantizer does) and, on a llama whose
rows are whole super-blocks, for every type."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from factories import generate, make_prompt
from family_checkpoints import hf_greedy, write_family_checkpoint
from gguf_files import GGUF_FAMILIES, SUPER_BLOCK_SHAPES, dequantized_checkpoint, family_gguf
from test_family_parity import BLOCK_SIZE, FAMILY_NEW_TOKENS
from test_llama_parity import make_prompts

from benchmarks.llamacpp.gguf_export import export_gguf, tensor_type
from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.scheduler.engine_factory import EngineConfig

FALLBACK_FAMILIES = ("llama-bias", "gemma2")
"""Q4_K_M's fallbacks on two families (llama-bias's o_proj rows are 96 values: Q5_0; gemma2's
soft-caps and windows); every family in Q8_0."""


def float32_greedy(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    """The engine's greedy ids on the GGUF file read with ``--dtype float32``."""
    model = LocalModel.load(path, dtype="float32")
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=8, attention_backend="native")
    engine, _ = build_local_engine(model, config, model.arena_layout_of_blocks(BLOCK_SIZE, 64))
    assert engine.runner.model.dtype == torch.float32
    return generate(engine, prompts, FAMILY_NEW_TOKENS)


@pytest.mark.parametrize(
    ("family", "gguf_type"),
    [(f, "q8_0") for f in GGUF_FAMILIES] + [(f, "q4_k_m") for f in FALLBACK_FAMILIES],
)
def test_a_families_quantized_file_gives_transformers_float32_tokens_on_its_values(
    family: str, gguf_type: str, tmp_path: Path
) -> None:
    model_dir, path = family_gguf(tmp_path, family, "float32", gguf_type)
    prompts = make_prompts()
    reference = dequantized_checkpoint(model_dir, gguf_type, tmp_path / "dequantized")
    assert (
        float32_greedy(path, prompts) == hf_greedy(reference, prompts, FAMILY_NEW_TOKENS).token_ids
    )


@pytest.mark.parametrize(
    "gguf_type", ["q4_k_m", "q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]
)
def test_every_type_gives_transformers_float32_tokens_on_its_values(
    gguf_type: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.getbasetemp() / "super-block-llama"
    model_dir = root / "mistral"
    if not model_dir.exists():
        write_family_checkpoint(model_dir, "mistral", "float32", 11, **SUPER_BLOCK_SHAPES)
    path = export_gguf(model_dir, root / f"mistral-{gguf_type}.gguf", gguf_type)
    local = LocalModel.load(path, dtype="float32")
    types = set((local.quant_types or {}).values())
    assert types == ({"Q4_K", "Q6_K"} if gguf_type == "q4_k_m" else {gguf_type.upper()})
    prompts = [make_prompt(n, seed=n, vocab_size=512) for n in (3, 17, 40)]
    reference = dequantized_checkpoint(model_dir, gguf_type, root / f"dequantized-{gguf_type}")
    assert (
        float32_greedy(path, prompts) == hf_greedy(reference, prompts, FAMILY_NEW_TOKENS).token_ids
    )


def test_k_quant_rows_that_are_not_whole_super_blocks_fall_back_as_llama_cpps() -> None:
    assert tensor_type("blk.0.attn_q.weight", (64, 256), "q4_k_m") == "Q4_K"
    assert tensor_type("blk.0.attn_v.weight", (64, 256), "q4_k_m") == "Q6_K"
    assert tensor_type("output.weight", (32000, 256), "q4_k_m") == "Q6_K"
    assert tensor_type("token_embd.weight", (32000, 256), "q4_k_m") == "Q4_K"
    assert tensor_type("blk.0.attn_q.weight", (64, 64), "q4_k_m") == "Q5_0"
    assert tensor_type("blk.0.ffn_down.weight", (64, 128), "q4_k_m") == "Q8_0"
    assert tensor_type("blk.0.ffn_down.weight", (64, 128), "q5_k") == "Q5_1"
    assert tensor_type("blk.0.ffn_down.weight", (64, 40), "q6_k") == "F16"
    assert tensor_type("blk.0.ffn_down.weight", (64, 40), "q8_0") == "F32"
    assert tensor_type("blk.0.attn_norm.weight", (256,), "q4_k") == "F32"
    with pytest.raises(ValueError, match="gguf_type 'q2_k'"):
        tensor_type("blk.0.attn_q.weight", (64, 256), "q2_k")
