"""The model configuration the engine needs, parsed from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters (Su et al. 2021, "RoFormer", arXiv:2104.09864)."""

    theta: float
    """Base of the frequencies (rope_theta)."""
    rope_type: str = "default"
    """"default", "linear" or "llama3" (the scalings of transformers' modeling_rope_utils)."""
    factor: float = 1.0
    """Scaling factor (linear, llama3)."""
    low_freq_factor: float = 1.0
    """llama3 only."""
    high_freq_factor: float = 4.0
    """llama3 only."""
    original_max_position_embeddings: int = 8192
    """llama3 only: the context length the model was pre-trained with."""


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a Llama decoder (Touvron et al. 2023, arXiv:2302.13971)."""

    architecture: str
    """E.g. "LlamaForCausalLM"."""
    vocab_size: int
    """Rows of the embedding and of the LM head."""
    hidden_size: int
    """Model width (d_model)."""
    intermediate_size: int
    """Width of the SwiGLU MLP."""
    num_hidden_layers: int
    """Decoder layers."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """KV heads (grouped-query attention when fewer than query heads)."""
    head_dim: int
    """Width of one head."""
    max_position_embeddings: int
    """Context length in tokens."""
    rms_norm_eps: float
    """Epsilon of RMSNorm."""
    rope: RopeConfig
    """Rotary embedding parameters."""
    tie_word_embeddings: bool
    """The LM head reuses the embedding matrix."""
    bos_token_id: int | None
    """Beginning-of-sequence id, if any."""
    eos_token_ids: tuple[int, ...]
    """End-of-sequence ids (generation_config.json wins over config.json)."""

    @classmethod
    def from_json(cls, config_json: str, generation_config_json: str = "") -> ModelConfig:
        """Parses config.json (and generation_config.json for EOS ids).

        Accepts both the transformers 4 (``rope_theta``/``rope_scaling``) and the transformers 5
        (``rope_parameters``) spellings of RoPE settings.

        Raises:
            ValueError: invalid JSON, a missing field, an unsupported architecture or RoPE scaling.
        """
        try:
            cfg = json.loads(config_json)
            gen = json.loads(generation_config_json) if generation_config_json else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"config.json: {exc}") from None
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if archs[0] not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"config.json: architecture {archs[0]!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(
                architecture=archs[0],
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope=_parse_rope(cfg),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                bos_token_id=_first_id(gen.get("bos_token_id", cfg.get("bos_token_id"))),
                eos_token_ids=_ids(gen.get("eos_token_id", cfg.get("eos_token_id"))),
            )
        except KeyError as exc:
            raise ValueError(f"config.json: missing field {exc.args[0]!r}") from None

    @property
    def kv_dim(self) -> int:
        """Width of K (or V) for one token and layer: num_key_value_heads * head_dim."""
        return self.num_key_value_heads * self.head_dim


def _ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)


def _first_id(value: object) -> int | None:
    ids = _ids(value)
    return ids[0] if ids else None


def _parse_rope(cfg: dict) -> RopeConfig:
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    params.update(scaling)
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ("default", "linear", "llama3"):
        raise ValueError(f"config.json: rope scaling type {rope_type!r} is not supported")
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )
