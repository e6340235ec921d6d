"""What Gemma and Gemma 2 add to the family parity tests (test_family_parity.py, which runs both
families' greedy ids and prefill logits in float32 and bfloat16 with every backend).

What their checkpoints (:mod:`family_checkpoints`) exercise: the embedding scaled by
sqrt(hidden_size), the (1 + w) RMSNorm (norm weights drawn around 0, as Gemma's are centred),
GeLU-tanh (Gemma's legacy ``hidden_act: gelu`` means it), Gemma's attention_bias, tied embeddings
(untied for Gemma 2); Gemma 2's four norms per layer, ``query_pre_attn_scalar`` 24 != head_dim,
attention and final logit soft-caps small enough to bend the scores, and a sliding window of 16
tokens on layer 0 (full attention on layer 1) that prompts and generations outgrow (during
chunked prefill and decode).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import test_family_parity as family_parity
import torch
import transformers
from family_checkpoints import (
    FAMILIES,
    FAMILY_NEW_TOKENS,
    FamilyCheckpoints,
    write_family_checkpoint,
)
from test_llama_parity import BLOCK_SIZE, make_prompts

from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.checkpoints.checkpoint import CheckpointError, read_checkpoint
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.checkpoints.weight_check import check_weights
from zerolayer.scheduler.engine_factory import EngineConfig

SLIDING_WINDOW = FAMILIES["gemma2"][1]["sliding_window"]


def test_gemma2_prefill_longer_than_the_window_matches_transformers(
    family_checkpoints: FamilyCheckpoints,
) -> None:
    """The sliding layer's window in one prefill of 40 tokens (the greedy runs cover decodes)."""
    model_dir = family_checkpoints.model_dir("gemma2", "float32")
    prompt = torch.randint(3, 259, (40,), generator=torch.Generator().manual_seed(5))
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        reference_logits = hf(prompt.unsqueeze(0)).logits[0]
    logits = family_parity.prefill_logits(model_dir, prompt.tolist())
    torch.testing.assert_close(logits, reference_logits, atol=family_parity.LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize("family", ["gemma", "gemma2"])
def test_gemma_in_bfloat16_computes_as_transformers(family: str, tmp_path: Path) -> None:
    """Published Gemma checkpoints are bfloat16: the embedding scale rounded to it (sqrt(64) is
    exact, so hidden_size 48 here), norms in float32 then cast, soft-caps in bfloat16; the
    logits of a 40-token prefill are transformers' bit for bit."""
    model_dir = write_family_checkpoint(tmp_path, family, "bfloat16", 11, hidden_size=48)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    assert hf.dtype == torch.bfloat16
    prompt = torch.randint(3, 259, (40,), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        reference_logits = hf(prompt.unsqueeze(0)).logits[0].float()
    logits = family_parity.prefill_logits(model_dir, prompt.tolist())
    torch.testing.assert_close(logits, reference_logits, atol=0, rtol=0)


def test_gemma_options_are_parsed(family_checkpoints: FamilyCheckpoints) -> None:
    gemma, gemma2 = (
        ModelConfig.from_json(
            (family_checkpoints.model_dir(f, "float32") / "config.json").read_text()
        )
        for f in ("gemma", "gemma2")
    )
    assert gemma.hidden_act == "gelu_pytorch_tanh" and gemma.tie_word_embeddings
    assert gemma.gemma_norms and gemma.scale_embeddings and not gemma.sandwich_norms
    assert gemma.qkv_bias and gemma.o_bias
    assert gemma.sliding_window is None and gemma.max_model_len == 256
    assert gemma2.sandwich_norms and gemma2.query_pre_attn_scalar == 24
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (2.0, 3.0)
    # Layer 0 slides, in the forward: the context is not capped at the window, and the prompt
    # of the prefill check and every generation outgrow it.
    assert gemma2.sliding_window == SLIDING_WINDOW and gemma2.window_layers == (0,)
    assert gemma2.needs_reference_attention and gemma2.max_model_len == 256
    prompts = make_prompts()
    assert (
        len(prompts[2]) > SLIDING_WINDOW
        and min(map(len, prompts)) + FAMILY_NEW_TOKENS > SLIDING_WINDOW
    )


def test_gemma2_checkpoint_without_its_extra_norms_is_refused(
    family_checkpoints: FamilyCheckpoints,
) -> None:
    manifest = read_checkpoint(family_checkpoints.model_dir("gemma2", "float32"))
    config = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
    check_weights(manifest, config)
    name = "model.layers.1.post_feedforward_layernorm.weight"
    without = dataclasses.replace(
        manifest, tensors=tuple(t for t in manifest.tensors if t.name != name)
    )
    with pytest.raises(CheckpointError, match=f"missing tensor {name!r}"):
        check_weights(without, config)


def test_batch_invariant_gemma2_warns_its_attention_is_not(
    family_checkpoints: FamilyCheckpoints, caplog: pytest.LogCaptureFixture
) -> None:
    model = LocalModel.load(family_checkpoints.model_dir("gemma2", "float32"))
    config = EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=8, attention_backend="native", batch_invariant=True
    )
    build_local_engine(model, config, model.arena_layout_of_blocks(BLOCK_SIZE, 16))
    assert "runs the reference path, NOT batch invariant" in caplog.text
