"""Parity of Gemma and Gemma 2 with transformers, on tiny random float32 models the test builds and
saves itself: greedy ids of four prompts through the whole engine (reference attention, and the
native CPU kernels where they apply), and the logits of one prefill of our forward.

What the configs exercise: the embedding scaled by sqrt(hidden_size), the (1 + w) RMSNorm (norm
weights redrawn around 0, as Gemma's are centred), GeLU-tanh (Gemma's legacy ``hidden_act: gelu``
means it), head_dim 32 != 64 / 4, Gemma's attention_bias, tied embeddings (untied for Gemma 2,
whose greedy runs would otherwise repeat one token); Gemma 2's four norms per layer,
``query_pre_attn_scalar`` 24 != head_dim, attention and final logit soft-caps small enough to bend
the scores, and alternating sliding-window layers with a window of 16 tokens that prompts and
generations outgrow (during chunked prefill and decode).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import test_family_parity as family_parity
import torch
import transformers
from test_family_parity import assert_greedy_ids
from test_llama_parity import BLOCK_SIZE, MAX_NEW_TOKENS, hf_generate, make_prompts

from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.checkpoints.byte_tokenizer import write_byte_level_tokenizer
from zerolayer.checkpoints.checkpoint import CheckpointError, read_checkpoint
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.checkpoints.weight_check import check_weights
from zerolayer.scheduler.engine_factory import EngineConfig

TINY = {
    "vocab_size": 259,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
SLIDING_WINDOW = 16
FAMILIES: dict[str, tuple[type, dict]] = {
    "gemma": (transformers.GemmaConfig, {"attention_bias": True}),
    "gemma2": (
        transformers.Gemma2Config,
        {
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
            "sliding_window": SLIDING_WINDOW,
            "tie_word_embeddings": False,
        },
    ),
}


def write_gemma_model(out_dir: Path, family: str, **changes: object) -> Path:
    """Saves a seeded random ``family`` model (safetensors) plus a byte-level tokenizer; ``changes``
    override the family's fields.

    Gemma's config.json gets the legacy ``hidden_act: "gelu"`` of the published Gemma 1 configs.
    """
    config_class, fields = FAMILIES[family]
    config = config_class(**{**TINY, **fields, **changes})
    torch.manual_seed(11 + sorted(FAMILIES).index(family))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(-0.5, 0.5)
            else:
                param.normal_(0.0, 0.15)
    model.save_pretrained(out_dir)
    if family == "gemma":
        config_path = out_dir / "config.json"
        saved = json.loads(config_path.read_text())
        saved["hidden_act"] = "gelu"
        config_path.write_text(json.dumps(saved))
    write_byte_level_tokenizer(out_dir, TINY["max_position_embeddings"])
    return out_dir


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts()


@pytest.fixture(scope="module")
def gemma_models(
    tmp_path_factory: pytest.TempPathFactory, prompts: list[list[int]]
) -> dict[str, tuple[Path, list[list[int]]]]:
    """Per family: its model directory and transformers' greedy ids of the prompts."""
    models = {}
    for family in FAMILIES:
        model_dir = write_gemma_model(tmp_path_factory.mktemp(family), family)
        models[family] = (model_dir, hf_generate(model_dir, prompts))
    return models


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gemma_matches_transformers(
    family: str, gemma_models: dict, prompts: list[list[int]]
) -> None:
    """The Llama-like families' check (greedy ids with reference attention, prefill logits)."""
    family_parity.test_family_matches_transformers(family, gemma_models, prompts)


def test_gemma2_prefill_longer_than_the_window_matches_transformers(gemma_models: dict) -> None:
    """The sliding layers' window in one prefill of 40 tokens (the greedy runs cover decodes)."""
    model_dir = gemma_models["gemma2"][0]
    prompt = torch.randint(3, TINY["vocab_size"], (40,), generator=torch.Generator().manual_seed(5))
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        reference_logits = hf(prompt.unsqueeze(0)).logits[0]
    logits = family_parity.prefill_logits(model_dir, prompt.tolist())
    torch.testing.assert_close(logits, reference_logits, atol=family_parity.LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gemma_in_bfloat16_computes_as_transformers(
    family: str, gemma_models: dict, tmp_path: Path
) -> None:
    """Published Gemma checkpoints are bfloat16: the embedding scale rounded to it (sqrt(64) is
    exact, so hidden_size 48 here), norms in float32 then cast, soft-caps in bfloat16."""
    # NOTE: no biases (the published Gemmas have none): in bfloat16 transformers adds them in
    # the matmul (one rounding), zerolayer after it (two).
    model_dir = write_gemma_model(tmp_path, family, hidden_size=48, attention_bias=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    hf.to(torch.bfloat16).save_pretrained(model_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    assert hf.dtype == torch.bfloat16
    prompt = torch.randint(3, TINY["vocab_size"], (40,), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        reference_logits = hf(prompt.unsqueeze(0)).logits[0].float()
    logits = family_parity.prefill_logits(model_dir, prompt.tolist())
    torch.testing.assert_close(logits, reference_logits, atol=1e-2, rtol=0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gemma_matches_transformers_with_native_kernels(
    family: str, gemma_models: dict, prompts: list[list[int]]
) -> None:
    """Gemma runs the csrc attention kernel; Gemma 2's soft-capped attention is routed to the
    reference (the kernels do not cap), with the same greedy ids either way."""
    model_dir, expected = gemma_models[family]
    model = LocalModel.load(model_dir)
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=8, attention_backend="native")
    engine, _ = build_local_engine(model, config, model.arena_layout_of_blocks(BLOCK_SIZE, 64))
    assert_greedy_ids(engine, prompts, expected)
    backend = "reference" if family == "gemma2" else "native"
    assert engine.stats().attention_backend == backend


def test_gemma_options_are_parsed(gemma_models: dict, prompts: list[list[int]]) -> None:
    gemma, gemma2 = (
        ModelConfig.from_json((gemma_models[f][0] / "config.json").read_text())
        for f in ("gemma", "gemma2")
    )
    assert gemma.hidden_act == "gelu_pytorch_tanh" and gemma.tie_word_embeddings
    assert gemma.gemma_norms and gemma.scale_embeddings and not gemma.sandwich_norms
    assert gemma.sliding_window is None and gemma.max_model_len == 256
    assert gemma2.sandwich_norms and gemma2.query_pre_attn_scalar == 24
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (2.0, 3.0)
    # Layers 0 and 2 slide, in the forward: the context is not capped at the window, and the
    # prompt of the logits check and every generation outgrow it.
    assert gemma2.sliding_window == SLIDING_WINDOW and gemma2.window_layers == (0, 2)
    assert gemma2.needs_reference_attention and gemma2.max_model_len == 256
    assert len(prompts[2]) > SLIDING_WINDOW and min(map(len, prompts)) + MAX_NEW_TOKENS > 16


def test_gemma2_checkpoint_without_its_extra_norms_is_refused(gemma_models: dict) -> None:
    manifest = read_checkpoint(gemma_models["gemma2"][0])
    config = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
    check_weights(manifest, config)
    name = "model.layers.1.post_feedforward_layernorm.weight"
    without = dataclasses.replace(
        manifest, tensors=tuple(t for t in manifest.tensors if t.name != name)
    )
    with pytest.raises(CheckpointError, match=f"missing tensor {name!r}"):
        check_weights(without, config)


def test_batch_invariant_gemma2_warns_its_attention_is_not(
    gemma_models: dict, caplog: pytest.LogCaptureFixture
) -> None:
    model = LocalModel.load(gemma_models["gemma2"][0])
    config = EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=8, attention_backend="native", batch_invariant=True
    )
    build_local_engine(model, config, model.arena_layout_of_blocks(BLOCK_SIZE, 16))
    assert "runs the reference path, NOT batch invariant" in caplog.text
