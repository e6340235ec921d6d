"""The config field table: complete against transformers' config classes, refused field by field,
no-effect fields without effect, and the same as the table in docs/models.md."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import transformers

from zerolayer.checkpoints.config_fields import (
    FAMILY_FIELDS,
    Handling,
    field_rules,
    markdown_table,
)
from zerolayer.checkpoints.model_config import ModelConfig

CONFIG_CLASSES = {
    "LlamaForCausalLM": transformers.LlamaConfig,
    "Qwen2ForCausalLM": transformers.Qwen2Config,
    "Qwen3ForCausalLM": transformers.Qwen3Config,
    "Phi3ForCausalLM": transformers.Phi3Config,
    "MistralForCausalLM": transformers.MistralConfig,
    "GemmaForCausalLM": transformers.GemmaConfig,
    "Gemma2ForCausalLM": transformers.Gemma2Config,
}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "models.md"
MINIMAL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 259,
}
REFUSED_VALUES = [
    # Every refused-unless-default field, and the refused values of implemented fields.
    ("is_encoder_decoder", True),
    ("quantization_config", {"quant_method": "gptq", "bits": 4}),
    ("hidden_act", "relu2"),
    ("hidden_act", "gelu_fast"),
    ("dtype", "float8_e4m3fn"),
    ("torch_dtype", "int8"),
    ("num_key_value_heads", 3),
    ("partial_rotary_factor", 0.5),
]


DEFAULT_RULE = field_rules("LlamaForCausalLM")["is_encoder_decoder"]


def signature_fields(config_class: type) -> dict[str, object]:
    params = inspect.signature(config_class.__init__).parameters
    return {k: p.default for k, p in params.items() if k not in ("self", "kwargs")}


def make_config(architecture: str, **fields: object) -> str:
    return json.dumps({"architectures": [architecture], **MINIMAL, **fields})


@pytest.mark.parametrize("architecture", sorted(CONFIG_CLASSES))
def test_table_covers_every_transformers_field(architecture: str) -> None:
    fields = signature_fields(CONFIG_CLASSES[architecture])
    assert sorted(set(fields) - set(field_rules(architecture))) == []


@pytest.mark.parametrize("architecture", sorted(CONFIG_CLASSES))
def test_table_covers_every_field_the_modeling_code_reads(architecture: str) -> None:
    """``config.<name>`` and ``getattr(config, "<name>", ...)`` in transformers' modeling file;
    ``_attn_implementation`` is the attention kernel transformers picks, not a config.json field."""
    source = Path(inspect.getfile(getattr(transformers, architecture))).read_text()
    read = set(re.findall(r"config\.(\w+)", source))
    read |= set(re.findall(r"getattr\(\s*(?:self\.)?config,\s*\"(\w+)\"", source))
    assert sorted(read - set(field_rules(architecture)) - {"_attn_implementation"}) == []


@pytest.mark.parametrize("architecture", sorted(CONFIG_CLASSES))
def test_refused_unless_default_uses_transformers_default(architecture: str) -> None:
    fields = signature_fields(CONFIG_CLASSES[architecture])
    for name, rule in field_rules(architecture).items():
        if rule.handling is Handling.DEFAULT_ONLY and name in fields:
            assert rule.default == fields[name], name


def test_supported_architectures_are_the_tested_ones() -> None:
    assert set(FAMILY_FIELDS) == set(CONFIG_CLASSES)


@pytest.mark.parametrize("architecture", sorted(CONFIG_CLASSES))
@pytest.mark.parametrize(("field", "value"), REFUSED_VALUES)
def test_refused_value_names_field_and_value(architecture: str, field: str, value: object) -> None:
    if field_rules(architecture).get(field, DEFAULT_RULE).handling is Handling.NO_EFFECT:
        pytest.skip(f"{architecture} does not read {field}")
    with pytest.raises(ValueError, match=re.escape(f"config.json: {field}={value!r} is not")):
        ModelConfig.from_json(make_config(architecture, **{field: value}))


@pytest.mark.parametrize("architecture", sorted(CONFIG_CLASSES))
def test_refused_fields_with_default_value_are_served(architecture: str) -> None:
    defaults = {
        name: rule.default
        for name, rule in field_rules(architecture).items()
        if rule.handling is Handling.DEFAULT_ONLY
    }
    ModelConfig.from_json(make_config(architecture, **defaults))


NO_EFFECT_VALUES = {
    "initializer_range": 1.0,
    "use_cache": False,
    "pad_token_id": 7,
    "attention_dropout": 0.5,
    "resid_pdrop": 0.5,
    "embd_pdrop": 0.5,
    "pretraining_tp": 2,
    "output_hidden_states": True,
    "return_dict": False,
    "chunk_size_feed_forward": 4,
    "id2label": {"0": "a"},
    "label2id": {"a": 0},
    "problem_type": "regression",
    "model_type": "other",
    "transformers_version": "4.0.0",
    "original_max_position_embeddings": 64,
    "hidden_act": "relu",
}


@pytest.mark.parametrize("architecture", sorted(CONFIG_CLASSES))
def test_no_effect_fields_do_not_change_the_config(architecture: str) -> None:
    base = ModelConfig.from_json(make_config(architecture))
    no_effect = [
        name
        for name, rule in field_rules(architecture).items()
        if rule.handling is Handling.NO_EFFECT
    ]
    assert sorted(set(no_effect) - set(NO_EFFECT_VALUES)) == []
    for name in no_effect:
        changed = make_config(architecture, **{name: NO_EFFECT_VALUES[name]})
        assert ModelConfig.from_json(changed) == base, name


def test_unknown_fields_are_ignored_as_transformers_ignores_them() -> None:
    base = ModelConfig.from_json(make_config("LlamaForCausalLM"))
    changed = make_config("LlamaForCausalLM", auto_map={"x": "y"}, some_future_flag=True)
    assert ModelConfig.from_json(changed) == base


def test_docs_table_is_the_code_table() -> None:
    text = DOCS.read_text()
    begin, end = "<!-- config-fields:begin -->\n", "<!-- config-fields:end -->"
    assert text[text.index(begin) + len(begin) : text.index(end)] == markdown_table()
