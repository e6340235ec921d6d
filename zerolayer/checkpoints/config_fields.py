"""How zerolayer handles each config.json field of the model families it serves.

One table per architecture lists every parameter of the transformers config class
(``transformers.<Family>Config.__init__``, transformers 5.23), every field its modeling code reads
(``head_dim`` of Qwen2 and Phi-3 is read with ``getattr``), plus the few keys transformers reads
outside that signature (``rope_scaling``, ``rope_theta``, ``torch_dtype``, ``quantization_config``).
Each field is *implemented* (the forward honours it), has *no effect* on greedy inference (training
or output-format settings), or is *refused unless default*: a config whose value differs from the
transformers default is refused before any layer starts.

Keys outside the table are ignored: transformers stores them as attributes its modeling code never
reads, so ignoring them computes exactly what transformers computes. ``docs/models.md`` holds the
same table; a test fails when the two disagree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum


class Handling(StrEnum):
    """What zerolayer does with a config field."""

    IMPLEMENTED = "implemented"
    NO_EFFECT = "no effect on inference"
    DEFAULT_ONLY = "refused unless default"


@dataclass(frozen=True)
class FieldRule:
    """The handling of one config field and the values zerolayer serves."""

    handling: Handling
    """Implemented, no effect, or refused unless the transformers default."""
    supported: str
    """The supported values, in words (for the docs and refusal messages)."""
    default: object = None
    """transformers' default; a DEFAULT_ONLY field with another value is refused."""


def _impl(supported: str = "any") -> FieldRule:
    return FieldRule(Handling.IMPLEMENTED, supported)


def _no_effect(supported: str = "any") -> FieldRule:
    return FieldRule(Handling.NO_EFFECT, supported)


def _default_only(default: object) -> FieldRule:
    return FieldRule(Handling.DEFAULT_ONLY, f"{json.dumps(default)} only", default)


HIDDEN_ACTS = ("silu", "gelu", "gelu_pytorch_tanh", "relu")
"""Activations of the gated MLP the forward implements (transformers' ACT2FN names)."""

COMMON_FIELDS: dict[str, FieldRule] = {
    "architectures": _impl("see Architectures"),
    "model_type": _no_effect(),
    "transformers_version": _no_effect(),
    "dtype": _impl("float32, float16, bfloat16; matrices must be stored in it"),
    "torch_dtype": _impl("as dtype (its transformers 4 spelling)"),
    "output_hidden_states": _no_effect(),
    "return_dict": _no_effect(),
    "chunk_size_feed_forward": _no_effect(),
    "is_encoder_decoder": _default_only(False),
    "id2label": _no_effect(),
    "label2id": _no_effect(),
    "problem_type": _no_effect(),
    "quantization_config": _impl(
        'null, or {"quant_method": "zerolayer_int8", "bits": 8, "group_size": G} '
        "(zerolayer quantize)"
    ),
    "vocab_size": _impl(),
    "hidden_size": _impl(),
    "intermediate_size": _impl(),
    "num_hidden_layers": _impl(),
    "num_attention_heads": _impl(),
    "num_key_value_heads": _impl("a divisor of num_attention_heads"),
    "hidden_act": _impl(", ".join(HIDDEN_ACTS)),
    "max_position_embeddings": _impl("the served context (max_model_len)"),
    "initializer_range": _no_effect(),
    "rms_norm_eps": _impl(),
    "use_cache": _no_effect(),
    "pad_token_id": _no_effect(),
    "bos_token_id": _impl("see Special tokens"),
    "eos_token_id": _impl("an id or a list; generation_config.json wins"),
    "tie_word_embeddings": _impl("true: the LM head is the embedding; false: lm_head.weight"),
    "rope_parameters": _impl("rope_type default, linear, llama3; partial_rotary_factor 1.0"),
    "rope_scaling": _impl("as rope_parameters (transformers 4 spelling)"),
    "rope_theta": _impl("as rope_parameters (transformers 4 spelling)"),
    "attention_dropout": _no_effect(),
    "zerolayer": _impl(
        "zerolayer's own: a GGUF file's qk_rows_interleaved, gemma_norm_offset_stored and "
        "rope_freq_factors (docs/models.md, GGUF)"
    ),
}
"""Fields every served family has (PretrainedConfig's and the decoder basics)."""

_QWEN_WINDOW_FIELDS: dict[str, FieldRule] = {
    "use_sliding_window": _impl("false; true caps the context at sliding_window"),
    "sliding_window": _impl("caps the context when a layer uses it"),
    "max_window_layers": _impl("layers from this index use the window"),
    "layer_types": _impl("full_attention; sliding_attention caps the context"),
}

_GEMMA_FIELDS: dict[str, FieldRule] = {
    "head_dim": _impl("any (default 256)"),
    "attention_bias": _impl("true, false (bias on q, k, v and o)"),
    "use_bidirectional_attention": _impl("null, false (true, bidirectional attention, is refused)"),
}
"""Gemma and Gemma 2 (their embedding scale and (1 + w) RMSNorm have no config field)."""

FAMILY_FIELDS: dict[str, dict[str, FieldRule]] = {
    "LlamaForCausalLM": {
        "head_dim": _impl("any (default hidden_size / num_attention_heads)"),
        "attention_bias": _impl("true, false (bias on q, k, v and o)"),
        "mlp_bias": _impl("true, false (bias on gate, up and down)"),
        "pretraining_tp": _no_effect("any (a training-time split of the same matmuls)"),
    },
    "Qwen2ForCausalLM": {
        "head_dim": _impl("any (default hidden_size / num_attention_heads)"),
        **_QWEN_WINDOW_FIELDS,
    },
    "Qwen3ForCausalLM": {
        "head_dim": _impl("any (default 128)"),
        "attention_bias": _impl("true, false (bias on q, k, v and o)"),
        **_QWEN_WINDOW_FIELDS,
    },
    "Phi3ForCausalLM": {
        "head_dim": _impl("any (default hidden_size / num_attention_heads)"),
        "resid_pdrop": _no_effect(),
        "embd_pdrop": _no_effect(),
        "original_max_position_embeddings": _no_effect("any (read by longrope, refused)"),
        "sliding_window": _impl("null, or caps the context at sliding_window"),
    },
    "MistralForCausalLM": {
        "head_dim": _impl("any (default hidden_size / num_attention_heads)"),
        "sliding_window": _impl("null, or caps the context at sliding_window"),
    },
    "GemmaForCausalLM": {
        **_GEMMA_FIELDS,
        "hidden_act": _impl(
            "silu, gelu_pytorch_tanh, relu; gelu means gelu_pytorch_tanh (as transformers reads it)"
        ),
    },
    "Gemma2ForCausalLM": {
        **_GEMMA_FIELDS,
        "hidden_act": _no_effect("any (Gemma 2 reads hidden_activation)"),
        "hidden_activation": _impl(", ".join(HIDDEN_ACTS)),
        "query_pre_attn_scalar": _impl("any: the softmax scale is its -1/2 power"),
        "attn_logit_softcapping": _impl("null, or tanh soft-capping of attention scores"),
        "final_logit_softcapping": _impl("null, or tanh soft-capping of the logits"),
        "sliding_window": _impl("null, or the window of the sliding layers (not capped)"),
        "layer_types": _impl("sliding_attention, full_attention (default: every other layer)"),
    },
}
"""Family-specific fields, by ``architectures[0]``."""

SUPPORTED_ARCHITECTURES = tuple(FAMILY_FIELDS)


def field_rules(architecture: str) -> dict[str, FieldRule]:
    """The full field table of one architecture (common fields, then the family's).

    Raises:
        KeyError: the architecture is not supported.
    """
    return {**COMMON_FIELDS, **FAMILY_FIELDS[architecture]}


def check_fields(cfg: dict, architecture: str) -> None:
    """Refuses the config.json fields of ``cfg`` that zerolayer does not serve.

    Raises:
        ValueError: "config.json: <field>=<value> is not supported (<supported values>)" for the
            first refused-unless-default field with another value.
    """
    for name, rule in field_rules(architecture).items():
        if rule.handling is Handling.DEFAULT_ONLY and name in cfg and cfg[name] != rule.default:
            raise ValueError(refusal(name, cfg[name], rule.supported))


def refusal(name: str, value: object, supported: str) -> str:
    """One-line refusal of a config.json field: its name, its value and what is served."""
    return f"config.json: {name}={value!r} is not supported (supported: {supported})"


FAMILY_NAMES: dict[str, str] = {
    "LlamaForCausalLM": "Llama",
    "Qwen2ForCausalLM": "Qwen2",
    "Qwen3ForCausalLM": "Qwen3",
    "Phi3ForCausalLM": "Phi-3",
    "MistralForCausalLM": "Mistral",
    "GemmaForCausalLM": "Gemma",
    "Gemma2ForCausalLM": "Gemma 2",
}
"""Short family names for the docs table."""


def markdown_table() -> str:
    """The field table of docs/models.md (Markdown): field, families, behaviour, supported values.

    Rows are sorted by field; a family field with the same rule in several families is one row.
    """
    rows: dict[tuple[str, FieldRule], list[str]] = {}
    for name, rule in COMMON_FIELDS.items():
        rows[(name, rule)] = ["all"]
    for arch, fields in FAMILY_FIELDS.items():
        for name, rule in fields.items():
            rows.setdefault((name, rule), []).append(FAMILY_NAMES[arch])
    lines = ["| field | families | behaviour | supported values |", "|---|---|---|---|"]
    for (name, rule), families in sorted(rows.items(), key=lambda item: item[0][0]):
        lines.append(
            f"| `{name}` | {', '.join(families)} | {rule.handling.value} | {rule.supported} |"
        )
    return "\n".join(lines) + "\n"
