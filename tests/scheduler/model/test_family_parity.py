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
from test_llama_parity import BLOCK_SIZE, hf_generate, make_engine, make_prompts, run_engine

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.byte_tokenizer import write_byte_level_tokenizer
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.model.attention import AttentionMetadata, PrefillSpan

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
    # Llama with every bias and a head_dim other than hidden_size / num_attention_heads.
    "llama-bias": (
        transformers.LlamaConfig,
        {"attention_bias": True, "mlp_bias": True, "head_dim": 24},
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
    """float32 [len(prompt), vocab] logits of one prefill of our forward (pure torch)."""
    local = LocalModel.load(model_dir)
    from zerolayer.scheduler.model.llama import LlamaModel

    model = LlamaModel(local.config, local.weights)
    cfg = local.config
    n = len(prompt)
    num_blocks = -(-n // BLOCK_SIZE)
    cache_shape = (num_blocks, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    caches = [(torch.zeros(cache_shape), torch.zeros(cache_shape)) for _ in model.layers]
    block_ids = torch.arange(num_blocks)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n),
        decode_rows=torch.zeros(0, dtype=torch.int64),
        decode_block_tables=torch.zeros(0, 1, dtype=torch.int64),
        decode_mask=torch.zeros(0, 1, 1, BLOCK_SIZE, dtype=torch.bool),
        prefills=(PrefillSpan(0, n, n, block_ids),),
        query_start_loc=torch.tensor([0, n]),
        seq_lens=torch.tensor([n]),
        block_tables=block_ids.unsqueeze(0),
    )
    hidden = model.forward(torch.tensor(prompt), torch.arange(n), caches, meta)
    return model.compute_logits(hidden)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_transformers(family: str, tmp_path: Path, prompts: list[list[int]]) -> None:
    model_dir = write_family_model(tmp_path, family)
    expected = hf_generate(model_dir, prompts)
    engine, _ = make_engine(model_dir, 64, 8)
    outputs = run_engine(engine, prompts)
    for i, reference in enumerate(expected):
        assert [t for r in outputs[str(i)] for t in r.new_token_ids] == reference, f"prompt {i}"

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        reference_logits = hf(torch.tensor([prompts[1]])).logits[0]
    logits = prefill_logits(model_dir, prompts[1])
    torch.testing.assert_close(logits, reference_logits, atol=LOGIT_ATOL, rtol=0)


def test_family_options_are_parsed(tmp_path: Path) -> None:
    configs = {
        family: ModelConfig.from_json(
            (write_family_model(tmp_path / family, family) / "config.json").read_text()
        )
        for family in FAMILIES
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
    json.dumps({f: c.architecture for f, c in configs.items()})
