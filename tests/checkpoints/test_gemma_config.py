"""Gemma and Gemma 2 config.json parsing: transformers' family defaults, the special-token ids of
the published configs, the refused values, and when Gemma 2's sliding window caps the context."""

from __future__ import annotations

import json

import pytest
import transformers

from zerolayer.checkpoints.model_config import ModelConfig

MINIMAL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4}
HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2}
CONFIG_CLASSES = {
    "GemmaForCausalLM": transformers.GemmaConfig,
    "Gemma2ForCausalLM": transformers.Gemma2Config,
}


def make_config(architecture: str, **fields: object) -> str:
    return json.dumps({"architectures": [architecture], **MINIMAL, **fields})


@pytest.mark.parametrize("architecture", sorted(CONFIG_CLASSES))
def test_absent_fields_take_transformers_defaults(architecture: str) -> None:
    """The published Gemma 1 configs omit tie_word_embeddings; Gemma 2's omit the soft-caps."""
    fields = {"num_attention_heads": 16 if architecture == "GemmaForCausalLM" else 8}
    ours = ModelConfig.from_json(make_config(architecture, **fields))
    theirs = CONFIG_CLASSES[architecture](**MINIMAL, **fields)
    assert ours.vocab_size == theirs.vocab_size
    assert ours.head_dim == theirs.head_dim
    assert ours.num_key_value_heads == theirs.num_key_value_heads
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    assert ours.tie_word_embeddings is theirs.tie_word_embeddings is True
    assert (ours.bos_token_id, ours.eos_token_ids) == (theirs.bos_token_id, (theirs.eos_token_id,))
    assert ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.rope.theta == theirs.rope_parameters["rope_theta"]
    if architecture == "Gemma2ForCausalLM":
        assert ours.hidden_act == theirs.hidden_activation
        assert ours.query_pre_attn_scalar == theirs.query_pre_attn_scalar
        assert ours.attn_logit_softcapping == theirs.attn_logit_softcapping
        assert ours.final_logit_softcapping == theirs.final_logit_softcapping
        assert ours.sliding_window == theirs.sliding_window
    else:
        assert ours.hidden_act == theirs.hidden_act


SPECIAL_TOKENS = {
    # family: (architecture, config.json ids, generation_config.json ids, BOS, EOS ids), from the
    # published google/gemma-2b, google/gemma-2-2b-it configs.
    "Gemma": (
        "GemmaForCausalLM",
        {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
        {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
        2,
        (1,),
    ),
    "Gemma-2-it": (
        "Gemma2ForCausalLM",
        {"bos_token_id": 2, "eos_token_id": [1, 107], "pad_token_id": 0},
        {
            "bos_token_id": 2,
            "eos_token_id": [1, 107],
            "pad_token_id": 0,
            "cache_implementation": "hybrid",
        },
        2,
        (1, 107),
    ),
    "Gemma-2-it, EOS in generation_config only": (
        "Gemma2ForCausalLM",
        {"bos_token_id": 2, "eos_token_id": 1},
        {"eos_token_id": [1, 107]},
        2,
        (1, 107),
    ),
}


@pytest.mark.parametrize("family", sorted(SPECIAL_TOKENS))
def test_gemma_special_token_ids(family: str) -> None:
    architecture, ids, generation_ids, bos, eos = SPECIAL_TOKENS[family]
    config = ModelConfig.from_json(
        make_config(architecture, **HEADS, **ids),
        json.dumps(generation_ids),
    )
    assert (config.bos_token_id, config.eos_token_ids) == (bos, eos)


@pytest.mark.parametrize(
    ("architecture", "field", "value"),
    [
        ("GemmaForCausalLM", "use_bidirectional_attention", True),
        ("Gemma2ForCausalLM", "use_bidirectional_attention", True),
        ("GemmaForCausalLM", "hidden_act", "gelu_new"),
        ("Gemma2ForCausalLM", "hidden_activation", "gelu_new"),
        ("Gemma2ForCausalLM", "query_pre_attn_scalar", None),
    ],
)
def test_refused_value_names_field_and_value(architecture: str, field: str, value: object) -> None:
    config = make_config(architecture, **HEADS, **{field: value})
    with pytest.raises(ValueError, match=f"config.json: {field}={value!r} is not supported"):
        ModelConfig.from_json(config)


def test_gemma_legacy_gelu_is_gelu_tanh_gemma2_gelu_is_exact() -> None:
    """transformers maps Gemma's legacy "gelu" to the tanh approximation, not Gemma 2's."""
    gemma = make_config("GemmaForCausalLM", **HEADS, hidden_act="gelu")
    gemma2 = make_config("Gemma2ForCausalLM", **HEADS, hidden_act="silu", hidden_activation="gelu")
    assert ModelConfig.from_json(gemma).hidden_act == "gelu_pytorch_tanh"
    assert ModelConfig.from_json(gemma2).hidden_act == "gelu"


@pytest.mark.parametrize(
    ("fields", "window", "layers"),
    [
        ({}, 4096, (0, 2)),
        ({"sliding_window": 512}, 512, (0, 2)),
        ({"sliding_window": 512, "layer_types": ["full_attention"] * 4}, None, ()),
        (
            {"sliding_window": 512, "layer_types": ["full_attention"] * 3 + ["sliding_attention"]},
            512,
            (3,),
        ),
        ({"sliding_window": None}, None, ()),
    ],
)
def test_gemma2_sliding_window_is_in_the_forward(
    fields: dict, window: int | None, layers: tuple[int, ...]
) -> None:
    """The window applies in the forward (to the layers given), so the context is not capped."""
    config = ModelConfig.from_json(make_config("Gemma2ForCausalLM", **HEADS, **fields))
    assert (config.sliding_window, config.window_layers) == (window, layers)
    assert config.max_model_len == 8192
    gemma = ModelConfig.from_json(make_config("GemmaForCausalLM", **HEADS, **fields))
    assert gemma.sliding_window is None and gemma.max_model_len == 8192
