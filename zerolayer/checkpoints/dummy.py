"""Seeded random-weight Llama checkpoints (the "dummy weights" serving benchmarks use).

Their text is meaningless: the weights are random. They exist so that zerolayer runs, tests and
benchmarks without downloading a model. Tokenizer: the byte-level one of
:mod:`zerolayer.checkpoints.byte_tokenizer`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from zerolayer.checkpoints.byte_tokenizer import (
    BOS_TOKEN_ID,
    BYTE_VOCAB_SIZE,
    EOS_TOKEN_ID,
    write_byte_level_tokenizer,
)
from zerolayer.checkpoints.model_cache import ensure_cached_model
from zerolayer.checkpoints.model_files import make_model_dir, share_model_files

FORMAT_VERSION = 1
"""Bumped when the generated files change, so cached copies are rewritten."""


@dataclass(frozen=True)
class DummyPreset:
    """Shape of a dummy Llama."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int = 2048
    dtype: str = "float32"
    """torch dtype name the weights are stored in."""


PRESETS: dict[str, DummyPreset] = {
    "tiny": DummyPreset(128, 256, 4, 4, 2, BYTE_VOCAB_SIZE),
    "small": DummyPreset(768, 2048, 12, 12, 4, 32000, dtype="bfloat16"),
    "medium": DummyPreset(1536, 4096, 16, 12, 4, 32000, dtype="bfloat16"),
    "1b": DummyPreset(2048, 5632, 22, 32, 4, 32000, dtype="bfloat16"),
}
"""``tiny`` is the tests' fast fp32 model (and ``make-dummy``'s default); ``small`` is a
125M-parameter Llama shape; ``1b`` is the 1.1B TinyLlama shape (the GPU device check's model)."""


def _config(p: DummyPreset) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": p.hidden_size,
        "intermediate_size": p.intermediate_size,
        "num_hidden_layers": p.num_hidden_layers,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.num_key_value_heads,
        "head_dim": p.hidden_size // p.num_attention_heads,
        "vocab_size": p.vocab_size,
        "max_position_embeddings": p.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "torch_dtype": p.dtype,
    }


def _tensors(p: DummyPreset, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, p.dtype)
    head_dim = p.hidden_size // p.num_attention_heads
    kv = p.num_key_value_heads * head_dim

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        # std 1/sqrt(fan_in) keeps activations O(1), so logits are spread and greedy picks are
        # well separated (robust to float rounding differences between implementations).
        w = torch.randn(out_features, in_features, generator=g) / in_features**0.5
        return w.to(dtype)

    t = {
        "model.embed_tokens.weight": torch.randn(p.vocab_size, p.hidden_size, generator=g).to(dtype)
    }
    for i in range(p.num_hidden_layers):
        pre = f"model.layers.{i}."
        t[pre + "input_layernorm.weight"] = torch.ones(p.hidden_size, dtype=dtype)
        t[pre + "self_attn.q_proj.weight"] = linear(p.hidden_size, p.hidden_size)
        t[pre + "self_attn.k_proj.weight"] = linear(kv, p.hidden_size)
        t[pre + "self_attn.v_proj.weight"] = linear(kv, p.hidden_size)
        t[pre + "self_attn.o_proj.weight"] = linear(p.hidden_size, p.hidden_size)
        t[pre + "post_attention_layernorm.weight"] = torch.ones(p.hidden_size, dtype=dtype)
        t[pre + "mlp.gate_proj.weight"] = linear(p.intermediate_size, p.hidden_size)
        t[pre + "mlp.up_proj.weight"] = linear(p.intermediate_size, p.hidden_size)
        t[pre + "mlp.down_proj.weight"] = linear(p.hidden_size, p.intermediate_size)
    t["model.norm.weight"] = torch.ones(p.hidden_size, dtype=dtype)
    t["lm_head.weight"] = linear(p.vocab_size, p.hidden_size)
    return t


def write_dummy_model(out_dir: Path, preset: DummyPreset, seed: int = 0) -> Path:
    """Writes a complete Hugging Face model directory with seeded random weights.

    Files: config.json, generation_config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json, all 0644; directories created for it are 0755
    (:mod:`zerolayer.checkpoints.model_files`). The same preset and seed always give the same
    weights.

    Returns:
        ``out_dir``.
    """
    make_model_dir(out_dir)
    (out_dir / "config.json").write_text(json.dumps(_config(preset), indent=2))
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID}, indent=2)
    )
    save_file(
        _tensors(preset, seed),
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt", "zerolayer_dummy": json.dumps(asdict(preset))},
    )
    write_byte_level_tokenizer(out_dir, preset.max_position_embeddings)
    share_model_files(out_dir)
    return out_dir


def ensure_dummy_model(
    preset_name: str = "tiny",
    seed: int = 0,
    cache_dir: Path | None = None,
    max_position_embeddings: int | None = None,
) -> Path:
    """Returns the directory of a cached dummy model, writing it once if missing.

    The model is written into a temporary sibling and renamed into place, so concurrent callers
    never see a half-written directory
    (:func:`zerolayer.checkpoints.model_cache.ensure_cached_model`). ``max_position_embeddings``
    (tokens) gives the preset another context length (the same weights: RoPE has no learned
    positions), cached under its own name; None: the preset's.

    Raises:
        KeyError: unknown preset name.
    """
    preset = PRESETS[preset_name]
    name = f"{preset_name}-seed{seed}-v{FORMAT_VERSION}"
    if max_position_embeddings not in (None, preset.max_position_embeddings):
        preset = replace(preset, max_position_embeddings=max_position_embeddings)
        name = f"{preset_name}-ctx{max_position_embeddings}-seed{seed}-v{FORMAT_VERSION}"
    return ensure_cached_model(
        name,
        lambda out_dir: write_dummy_model(out_dir, preset, seed),
        cache_dir,
    )
