"""Parity of every served Llama-like family with transformers, on tiny random float32 models the
test builds and saves itself: greedy ids of four prompts through the whole engine, and the logits of
one prefill of our forward.

Parameters are redrawn after transformers' init (biases and norms are zeros and ones there, which
would hide a missing bias or norm), with one seed per family.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from test_llama_parity import BLOCK_SIZE, hf_generate, make_engine, make_prompts, run_engine
from transformers.activations import ACT2FN

from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.bench.logit_agreement import chunked_logits
from zerolayer.checkpoints.byte_tokenizer import write_byte_level_tokenizer
from zerolayer.checkpoints.config_fields import HIDDEN_ACTS
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.engine_factory import EngineConfig
from zerolayer.scheduler.model.llama import ACTIVATIONS

TINY = {
    "vocab_size": 259,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
FAMILIES: dict[str, tuple[type, dict]] = {
    # Llama with every bias, a head_dim other than hidden_size / num_attention_heads and a GELU.
    "llama-bias": (
        transformers.LlamaConfig,
        {
            "attention_bias": True,
            "mlp_bias": True,
            "head_dim": 24,
            "hidden_act": "gelu_pytorch_tanh",
        },
    ),
    # SmolLM2 and Llama 3.2: Llama with tied embeddings (and Llama 3.2's llama3 RoPE).
    "llama-tied": (
        transformers.LlamaConfig,
        {
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "qwen2": (transformers.Qwen2Config, {"tie_word_embeddings": True}),
    "qwen3": (transformers.Qwen3Config, {"head_dim": 32, "tie_word_embeddings": True}),
    "phi3": (transformers.Phi3Config, {"sliding_window": None}),
    "mistral": (transformers.MistralConfig, {"sliding_window": 64, "head_dim": 16}),
}
LOGIT_ATOL = 1e-4


def write_family_model(out_dir: Path, family: str) -> Path:
    """Saves a seeded random ``family`` model (safetensors) plus a byte-level tokenizer."""
    config_class, fields = FAMILIES[family]
    config = config_class(**TINY, **fields)
    torch.manual_seed(sorted(FAMILIES).index(family))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.15)
    model.save_pretrained(out_dir)
    write_byte_level_tokenizer(out_dir, TINY["max_position_embeddings"])
    return out_dir


def prefill_logits(model_dir: Path, prompt: list[int]) -> torch.Tensor:
    """float32 [len(prompt), vocab] logits of one prefill of our forward (pure torch; KV caches
    in the model's dtype)."""
    return chunked_logits(model_dir, prompt, None, len(prompt), BLOCK_SIZE)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts()


@pytest.fixture(scope="module")
def family_models(
    tmp_path_factory: pytest.TempPathFactory, prompts: list[list[int]]
) -> dict[str, tuple[Path, list[list[int]]]]:
    """Per family: its model directory and transformers' greedy ids of the prompts."""
    models = {}
    for family in FAMILIES:
        model_dir = write_family_model(tmp_path_factory.mktemp(family), family)
        models[family] = (model_dir, hf_generate(model_dir, prompts))
    return models


def assert_greedy_ids(engine: Engine, prompts: list[list[int]], expected: list[list[int]]) -> None:
    outputs = run_engine(engine, prompts)
    for i, reference in enumerate(expected):
        assert [t for r in outputs[str(i)] for t in r.new_token_ids] == reference, f"prompt {i}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_transformers(
    family: str, family_models: dict, prompts: list[list[int]]
) -> None:
    model_dir, expected = family_models[family]
    engine, _ = make_engine(model_dir, 64, 8)
    assert_greedy_ids(engine, prompts, expected)

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        reference_logits = hf(torch.tensor([prompts[1]])).logits[0]
    logits = prefill_logits(model_dir, prompts[1])
    torch.testing.assert_close(logits, reference_logits, atol=LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_transformers_with_native_kernels(
    family: str, family_models: dict, prompts: list[list[int]]
) -> None:
    """The csrc attention and linear kernels on the families' shapes (head_dim 24 and 32, split
    outputs of fused projections) give the same greedy ids."""
    model_dir, expected = family_models[family]
    model = LocalModel.load(model_dir)
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=8, attention_backend="native")
    engine, _ = build_local_engine(model, config, model.arena_layout_of_blocks(BLOCK_SIZE, 64))
    assert_greedy_ids(engine, prompts, expected)
    assert engine.stats().attention_backend == "native"


def test_family_options_are_parsed(family_models: dict) -> None:
    configs = {
        family: ModelConfig.from_json((model_dir / "config.json").read_text())
        for family, (model_dir, _) in family_models.items()
    }
    assert configs["llama-bias"].qkv_bias and configs["llama-bias"].o_bias
    assert configs["llama-bias"].mlp_bias and configs["llama-bias"].head_dim == 24
    assert configs["qwen2"].qkv_bias and not configs["qwen2"].o_bias
    assert configs["qwen3"].qk_norm and configs["qwen3"].head_dim == 32
    assert configs["phi3"].fused_projections
    assert configs["mistral"].sliding_window == 64
    assert configs["mistral"].max_model_len == 64
    assert configs["phi3"].max_model_len == 256
    assert all(configs[f].tie_word_embeddings for f in ("llama-tied", "qwen2", "qwen3"))


def write_mixed_dtype_model(out_dir: Path) -> Path:
    """The llama-bias model in bfloat16 with its norm weights and biases kept in float32 (as some
    exports store them); config.json says bfloat16, as transformers' save_pretrained writes."""
    write_family_model(out_dir, "llama-bias")
    weights_path = out_dir / "model.safetensors"
    tensors = {
        name: t if t.dim() == 1 else t.to(torch.bfloat16)
        for name, t in load_file(weights_path).items()
    }
    save_file(tensors, str(weights_path), metadata={"format": "pt"})
    config = json.loads((out_dir / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (out_dir / "config.json").write_text(json.dumps(config))
    return out_dir


def test_float32_vectors_in_bfloat16_checkpoint_compute_as_transformers(
    tmp_path: Path, prompts: list[list[int]]
) -> None:
    """transformers' dtype="auto" casts the float32 vectors to bfloat16 at load; zerolayer casts
    them per use, which rounds the same (the issue's crash: float32 norms in a bf16 forward)."""
    model_dir = write_mixed_dtype_model(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    assert hf.model.norm.weight.dtype == torch.bfloat16
    with torch.inference_mode():
        reference_logits = hf(torch.tensor([prompts[1]])).logits[0].float()
    logits = prefill_logits(model_dir, prompts[1])
    # NOTE: exact: biases are added inside the matmul (one rounding), as nn.Linear does; added
    # after a rounded product they moved these logits by about 0.07.
    torch.testing.assert_close(logits, reference_logits, atol=0, rtol=0)
    assert logits.argmax(-1).tolist() == reference_logits.argmax(-1).tolist()
    engine, _ = make_engine(model_dir, 64, 8)
    outputs = run_engine(engine, prompts)
    assert all(len([t for r in out for t in r.new_token_ids]) > 0 for out in outputs.values())


@pytest.mark.parametrize("name", HIDDEN_ACTS)
def test_activations_are_transformers_activations(name: str) -> None:
    x = torch.linspace(-6.0, 6.0, 1001)
    assert torch.equal(ACTIVATIONS[name](x), ACT2FN[name](x))


def test_a_tied_model_with_its_own_lm_head_uses_it_as_transformers_does(
    tmp_path: Path, family_models: dict, prompts: list[list[int]]
) -> None:
    """tie_word_embeddings with an lm_head.weight of other values in the checkpoint: transformers
    5 "will NOT tie them" and computes the logits with lm_head.weight; so does zerolayer."""
    source, _ = family_models["llama-tied"]
    model_dir = tmp_path / "tied-own-head"
    model_dir.mkdir()
    for path in source.iterdir():
        (model_dir / path.name).write_bytes(path.read_bytes())
    tensors = load_file(model_dir / "model.safetensors")
    generator = torch.Generator().manual_seed(5)
    embed = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = torch.randn(embed.shape, generator=generator) * 0.3
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert not torch.equal(hf.lm_head.weight, hf.model.embed_tokens.weight)
    with torch.inference_mode():
        reference_logits = hf(torch.tensor([prompts[1]])).logits[0]
    logits = prefill_logits(model_dir, prompts[1])
    torch.testing.assert_close(logits, reference_logits, atol=LOGIT_ATOL, rtol=0)
