"""Tests for ModelConfig.from_json against transformers 4 and 5 spellings of Llama configs.

The two reference configs are the published Llama 3.1 8B config.json (transformers 4 spelling) and
what transformers 5.23 ``LlamaConfig(...).to_json_string()`` writes for the same RoPE settings.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from zerolayer.checkpoints.model_config import ModelConfig, RopeConfig

LLAMA3_ROPE = {
    "factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}

LLAMA_31_8B_TRANSFORMERS_4 = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": LLAMA3_ROPE,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "vocab_size": 128256,
}

LLAMA_TRANSFORMERS_5 = {
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pad_token_id": None,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {**LLAMA3_ROPE, "rope_theta": 500000.0},
    "tie_word_embeddings": False,
    "transformers_version": "5.23.0",
    "vocab_size": 32000,
}

MINIMAL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 259,
}

REQUIRED_FIELDS = list(MINIMAL)


def make_config(base: dict | None = None, drop: tuple[str, ...] = (), **fields: object) -> str:
    cfg = {k: v for k, v in (base or MINIMAL).items() if k not in drop}
    cfg.update(fields)
    return json.dumps(cfg)


def test_transformers_4_llama_31() -> None:
    config = ModelConfig.from_json(make_config(LLAMA_31_8B_TRANSFORMERS_4))
    assert config == ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope=RopeConfig(
            theta=500000.0,
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
        dtype="bfloat16",
    )
    assert config.kv_dim == 1024


def test_transformers_5_rope_parameters() -> None:
    config = ModelConfig.from_json(make_config(LLAMA_TRANSFORMERS_5))
    assert config.architecture == "LlamaForCausalLM"  # transformers 5 may omit architectures
    assert config.rope == RopeConfig(
        theta=500000.0,
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    assert (config.num_key_value_heads, config.head_dim, config.kv_dim) == (32, 128, 4096)
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))
    assert config.rms_norm_eps == 1e-6


def test_both_spellings_give_the_same_rope() -> None:
    t4 = make_config(MINIMAL, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE)
    t5 = make_config(MINIMAL, rope_parameters={**LLAMA3_ROPE, "rope_theta": 500000.0})
    assert ModelConfig.from_json(t4) == ModelConfig.from_json(t5)


def test_default_rope_without_scaling() -> None:
    assert ModelConfig.from_json(make_config(rope_theta=10000.0, rope_scaling=None)).rope == (
        RopeConfig(theta=10000.0)
    )
    t5_default = {"rope_type": "default", "rope_theta": 1000000.0}
    assert ModelConfig.from_json(make_config(rope_parameters=t5_default)).rope == RopeConfig(
        theta=1000000.0, rope_type="default"
    )


def test_legacy_type_key_for_linear_scaling() -> None:
    rope = ModelConfig.from_json(
        make_config(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 4.0})
    ).rope
    assert rope == RopeConfig(theta=10000.0, rope_type="linear", factor=4.0)


def test_defaults_of_optional_fields() -> None:
    config = ModelConfig.from_json(make_config())
    assert config == ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=259,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope=RopeConfig(theta=10000.0),
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_ids=(),
    )


@pytest.mark.parametrize("head_dim", [None, 0])
def test_null_head_dim_and_kv_heads_fall_back(head_dim: int | None) -> None:
    config = ModelConfig.from_json(make_config(head_dim=head_dim, num_key_value_heads=None))
    assert (config.head_dim, config.num_key_value_heads) == (16, 4)


def test_explicit_head_dim_wins_over_hidden_by_heads() -> None:
    # As in Mistral NeMo: 5120 / 32 = 160, but the heads are 128 wide.
    config = ModelConfig.from_json(
        make_config(hidden_size=5120, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    )
    assert (config.head_dim, config.num_key_value_heads, config.kv_dim) == (128, 8, 1024)


def test_generation_config_eos_overrides_config_json() -> None:
    config_json = make_config(bos_token_id=1, eos_token_id=2)
    assert ModelConfig.from_json(config_json).eos_token_ids == (2,)
    config = ModelConfig.from_json(config_json, '{"bos_token_id": 5, "eos_token_id": [7, 2, 9]}')
    assert (config.bos_token_id, config.eos_token_ids) == (5, (7, 2, 9))
    assert ModelConfig.from_json(config_json, '{"eos_token_id": 11}').eos_token_ids == (11,)


def test_generation_config_without_eos_keeps_config_json_ids() -> None:
    config = ModelConfig.from_json(
        make_config(bos_token_id=1, eos_token_id=[2, 3]), '{"do_sample": true, "temperature": 0.6}'
    )
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2, 3))


def test_bos_list_takes_the_first_id() -> None:
    assert ModelConfig.from_json(make_config(bos_token_id=[4, 5])).bos_token_id == 4


def test_tie_word_embeddings() -> None:
    assert ModelConfig.from_json(make_config(tie_word_embeddings=True)).tie_word_embeddings


def test_config_is_frozen() -> None:
    config = ModelConfig.from_json(make_config())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_size = 1  # type: ignore[misc]


@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "Qwen2MoeForCausalLM"])
def test_unsupported_architecture_is_named(architecture: str) -> None:
    with pytest.raises(ValueError, match=f"architecture '{architecture}' is not supported"):
        ModelConfig.from_json(make_config(architectures=[architecture]))


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "longrope"])
def test_unsupported_rope_type_is_named(rope_type: str) -> None:
    scaling = {"rope_type": rope_type, "factor": 4.0}
    with pytest.raises(ValueError, match=f"rope scaling type '{rope_type}' is not supported"):
        ModelConfig.from_json(make_config(rope_scaling=scaling))
    with pytest.raises(ValueError, match=f"rope scaling type '{rope_type}' is not supported"):
        ModelConfig.from_json(make_config(rope_parameters={**scaling, "rope_theta": 1e4}))


def test_unsupported_legacy_rope_type_is_named() -> None:
    with pytest.raises(ValueError, match="rope scaling type 'dynamic' is not supported"):
        ModelConfig.from_json(make_config(rope_scaling={"type": "dynamic", "factor": 2.0}))


@pytest.mark.parametrize("field", REQUIRED_FIELDS)
def test_missing_field_is_named(field: str) -> None:
    with pytest.raises(ValueError, match=f"^config.json: missing field '{field}'$"):
        ModelConfig.from_json(make_config(drop=(field,)))


@pytest.mark.parametrize(
    ("config_json", "generation_config_json"),
    [("{not json", ""), (make_config(), "{not json")],
    ids=["config", "generation-config"],
)
def test_invalid_json_is_a_value_error(config_json: str, generation_config_json: str) -> None:
    with pytest.raises(ValueError, match="config.json"):
        ModelConfig.from_json(config_json, generation_config_json)


FAMILY_SPECIAL_TOKENS = {
    # family: (architecture, config.json ids, generation_config.json ids, expected BOS, EOS ids),
    # from each model's published config.json / generation_config.json.
    "Qwen2.5-Instruct": (
        "Qwen2ForCausalLM",
        {"bos_token_id": 151643, "eos_token_id": 151645},
        {"bos_token_id": 151643, "eos_token_id": [151645, 151643]},
        151643,
        (151645, 151643),
    ),
    "Qwen3": (
        "Qwen3ForCausalLM",
        {"bos_token_id": 151643, "eos_token_id": 151645},
        {"bos_token_id": 151643, "eos_token_id": [151645, 151643]},
        151643,
        (151645, 151643),
    ),
    "Llama-3.2-Instruct": (
        "LlamaForCausalLM",
        {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
        {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
        128000,
        (128001, 128008, 128009),
    ),
    "SmolLM2-Instruct": (
        "LlamaForCausalLM",
        {"bos_token_id": 1, "eos_token_id": 2},
        {"bos_token_id": 1, "eos_token_id": 2},
        1,
        (2,),
    ),
    "Phi-3-mini-instruct": (
        "Phi3ForCausalLM",
        {"bos_token_id": 1, "eos_token_id": 32000},
        {"bos_token_id": 1, "eos_token_id": [32000, 32001, 32007]},
        1,
        (32000, 32001, 32007),
    ),
    "Mistral-Instruct": (
        "MistralForCausalLM",
        {"bos_token_id": 1, "eos_token_id": 2},
        {},
        1,
        (2,),
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILY_SPECIAL_TOKENS))
def test_family_special_token_ids(family: str) -> None:
    architecture, ids, generation_ids, bos, eos = FAMILY_SPECIAL_TOKENS[family]
    config = ModelConfig.from_json(
        make_config(architectures=[architecture], num_key_value_heads=2, **ids),
        json.dumps(generation_ids),
    )
    assert (config.bos_token_id, config.eos_token_ids) == (bos, eos)


@pytest.mark.parametrize(
    ("architecture", "fields", "window"),
    [
        ("LlamaForCausalLM", {"sliding_window": 16}, None),
        ("MistralForCausalLM", {}, 4096),  # transformers' default
        ("MistralForCausalLM", {"sliding_window": None}, None),  # Mistral v0.2+
        ("MistralForCausalLM", {"sliding_window": 64}, 64),
        ("Phi3ForCausalLM", {}, None),
        ("Phi3ForCausalLM", {"sliding_window": 2047}, 2047),
        # Qwen2.5's published config: a window that no layer uses.
        ("Qwen2ForCausalLM", {"use_sliding_window": False, "sliding_window": 32}, None),
        ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 32}, None),
        (
            "Qwen2ForCausalLM",
            {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1},
            32,
        ),
        (
            "Qwen3ForCausalLM",
            {
                "use_sliding_window": True,
                "sliding_window": 32,
                "layer_types": ["full_attention", "sliding_attention"],
            },
            32,
        ),
        (
            "Qwen3ForCausalLM",
            {"use_sliding_window": True, "layer_types": ["full_attention"] * 2},
            None,
        ),
    ],
)
def test_sliding_window_caps_the_served_context(
    architecture: str, fields: dict, window: int | None
) -> None:
    config = ModelConfig.from_json(
        make_config(
            architectures=[architecture],
            num_key_value_heads=2,
            max_position_embeddings=8192,
            **fields,
        )
    )
    assert config.sliding_window == window
    assert config.max_model_len == (8192 if window is None else window)


def test_qwen3_head_dim_defaults_to_128() -> None:
    config = ModelConfig.from_json(
        make_config(architectures=["Qwen3ForCausalLM"], num_key_value_heads=2)
    )
    assert (config.head_dim, config.qk_norm, config.qkv_bias) == (128, True, False)


def test_a_legacy_rope_scaling_wins_over_rope_parameters() -> None:
    """A transformers 5 save carries rope_parameters {"rope_type": "default"}; a rope_scaling
    added beside it (legacy "type" spelling) is what transformers applies, or refuses."""
    base = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    linear = {**base, "rope_scaling": {"type": "linear", "factor": 4.0}}
    rope = ModelConfig.from_json(json.dumps(linear)).rope
    assert (rope.rope_type, rope.factor) == ("linear", 4.0)
    for kind in ("yarn", "longrope", "dynamic"):
        config = {**base, "rope_scaling": {"type": kind, "factor": 2.0}}
        with pytest.raises(ValueError, match=kind):
            ModelConfig.from_json(json.dumps(config))
