"""The model configuration the engine needs, parsed from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass

from zerolayer.checkpoints.config_fields import (
    FAMILY_FIELDS,
    HIDDEN_ACTS,
    SUPPORTED_ARCHITECTURES,
    check_fields,
    refusal,
)
from zerolayer.checkpoints.int8_format import BITS, QUANT_METHOD

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
ZEROLAYER_KEY = "zerolayer"
"""config.json's key of what the stored weights' layout adds to the transformers fields."""
"""config.json dtypes the forward computes in."""

GEMMA_ARCHITECTURES = ("GemmaForCausalLM", "Gemma2ForCausalLM")
"""Families with Gemma's embedding scale and (1 + w) RMSNorm."""

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelConfig", "RopeConfig"]


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
    freq_factors: tuple[float, ...] = ()
    """Per frequency, a divisor applied after the scaling (llama.cpp's ``rope_freqs.weight``,
    how a GGUF file carries llama 3's scaling); empty: none."""


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a Llama-like decoder (Touvron et al. 2023, arXiv:2302.13971) and
    the options of the families served as variants of it (Qwen2, Qwen3, Phi-3, Mistral)."""

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
    hidden_act: str = "silu"
    """Activation of the gated MLP's gate (one of config_fields.HIDDEN_ACTS)."""
    qkv_bias: bool = False
    """q_proj, k_proj and v_proj have biases (Llama/Qwen3 attention_bias, always for Qwen2)."""
    o_bias: bool = False
    """o_proj has a bias (Llama/Qwen3 attention_bias)."""
    mlp_bias: bool = False
    """gate_proj, up_proj and down_proj have biases (Llama mlp_bias)."""
    qk_norm: bool = False
    """Per-head RMSNorm of q and k before RoPE (Qwen3)."""
    fused_projections: bool = False
    """One qkv_proj and one gate_up_proj matrix per layer (Phi-3)."""
    sliding_window: int | None = None
    """Attention window of the layers that use one (None: every layer attends to all tokens)."""
    dtype: str | None = None
    """config.json's dtype (or torch_dtype); None: the embedding's dtype."""
    gemma_norms: bool = False
    """Gemma's RMSNorm: the normalized float32 activations times (1 + weight) in float32, then
    cast back (transformers' GemmaRMSNorm); Llama's casts first and multiplies by weight."""
    scale_embeddings: bool = False
    """The embedding is multiplied by sqrt(hidden_size) rounded to the model dtype (Gemma)."""
    sandwich_norms: bool = False
    """Gemma 2: the attention and MLP outputs are normalized before the residual add
    (post_attention_layernorm, post_feedforward_layernorm), and the MLP input by
    pre_feedforward_layernorm."""
    query_pre_attn_scalar: float | None = None
    """The softmax scale is query_pre_attn_scalar ** -0.5 (Gemma 2); None: head_dim ** -0.5."""
    attn_logit_softcapping: float | None = None
    """Attention scores s become tanh(s / cap) * cap before the mask and softmax (Gemma 2)."""
    final_logit_softcapping: float | None = None
    """Logits l become tanh(l / cap) * cap (Gemma 2)."""
    window_layers: tuple[int, ...] = ()
    """Layers whose queries see only the last ``sliding_window`` keys (key > query -
    sliding_window, transformers' sliding_window_overlay), in the reference attention (Gemma 2).
    With any, the context is not capped at the window."""
    int8_group_size: int | None = None
    """Weights per scale of an int8 checkpoint (``zerolayer quantize``, format in
    :mod:`zerolayer.checkpoints.int8_format`); None: the matrices are stored in ``dtype``."""
    qk_rows_interleaved: bool = False
    """The q and k projection rows are in llama.cpp's interleaved rotary layout (a GGUF
    ``llama`` file: each head's dimension pairs adjacent); the forward maps their outputs back to
    the rotate-half layout."""
    gemma_norm_offset_stored: bool = False
    """Gemma's norm weights are stored as 1 + w (a GGUF file): the norm multiplies by the
    stored weight."""

    @classmethod
    def from_json(cls, config_json: str, generation_config_json: str = "") -> ModelConfig:
        """Parses config.json (and generation_config.json for EOS ids).

        Accepts both the transformers 4 (``rope_theta``/``rope_scaling``) and the transformers 5
        (``rope_parameters``) spellings of RoPE settings.

        Raises:
            ValueError: invalid JSON, a missing field, an unsupported architecture or RoPE scaling,
                or a field value zerolayer refuses (one line naming field and value; the table is
                :mod:`zerolayer.checkpoints.config_fields`).
        """
        try:
            cfg = json.loads(config_json)
            gen = json.loads(generation_config_json) if generation_config_json else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"config.json: {exc}") from None
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"config.json: architecture {arch!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        check_fields(cfg, arch)
        cfg = {**_FAMILY_DEFAULTS.get(arch, {}), **cfg}
        try:
            return cls(
                **_shapes(cfg, arch),
                **_family_options(cfg, arch),
                **_gemma_options(cfg, arch),
                **_tokens(cfg, gen),
                int8_group_size=_int8_group_size(cfg.get("quantization_config")),
                **_stored_layout(cfg),
            )
        except KeyError as exc:
            raise ValueError(f"config.json: missing field {exc.args[0]!r}") from None

    @property
    def kv_dim(self) -> int:
        """Width of K (or V) for one token and layer: num_key_value_heads * head_dim."""
        return self.num_key_value_heads * self.head_dim

    @property
    def needs_reference_attention(self) -> bool:
        """Attention needs the pure-torch reference (the native and Triton kernels neither
        soft-cap nor window): Gemma 2."""
        return self.attn_logit_softcapping is not None or bool(self.window_layers)

    @property
    def max_model_len(self) -> int:
        """Longest sequence served, in tokens: max_position_embeddings, capped at the sliding
        window when a layer uses one (so the window never applies and attention is exact), unless
        the forward implements the window (``window_layers``)."""
        if self.sliding_window is None or self.window_layers:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)


_GEMMA_DEFAULTS = {
    "vocab_size": 256000,
    "head_dim": 256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "bos_token_id": 2,
    "eos_token_id": 1,
}
_FAMILY_DEFAULTS: dict[str, dict] = {
    "GemmaForCausalLM": {**_GEMMA_DEFAULTS, "num_key_value_heads": 16},
    "Gemma2ForCausalLM": {
        **_GEMMA_DEFAULTS,
        "num_key_value_heads": 4,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
    },
}
"""transformers' defaults of the families whose defaults differ from Llama's (absent keys)."""


def _hidden_act(cfg: dict, arch: str) -> str:
    """The MLP activation as transformers reads it: Gemma maps the legacy "gelu" to
    "gelu_pytorch_tanh" (GemmaConfig.__post_init__); Gemma 2 reads ``hidden_activation``.

    Raises:
        ValueError: the activation is not one of HIDDEN_ACTS.
    """
    field = "hidden_activation" if arch == "Gemma2ForCausalLM" else "hidden_act"
    default = "gelu_pytorch_tanh" if arch in GEMMA_ARCHITECTURES else "silu"
    hidden_act = cfg.get(field) or default
    if arch == "GemmaForCausalLM" and hidden_act == "gelu":
        hidden_act = "gelu_pytorch_tanh"
    if hidden_act not in HIDDEN_ACTS:
        raise ValueError(refusal(field, hidden_act, ", ".join(HIDDEN_ACTS)))
    return hidden_act


def _shapes(cfg: dict, arch: str) -> dict:
    """The architecture-independent shape fields; transformers' per-family defaults apply."""
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    # NOTE: Qwen2/Qwen3 default to 32 KV heads and Qwen3 to head_dim 128, not to the Llama ones.
    default_kv_heads = 32 if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") else heads
    default_kv_heads = 8 if arch == "MistralForCausalLM" else default_kv_heads
    default_head_dim = 128 if arch == "Qwen3ForCausalLM" else hidden // heads
    kv_heads = int(cfg.get("num_key_value_heads") or default_kv_heads)
    if heads % kv_heads:
        raise ValueError(
            refusal("num_key_value_heads", kv_heads, "a divisor of num_attention_heads")
        )
    hidden_act = _hidden_act(cfg, arch)
    dtype_field = "dtype" if cfg.get("dtype") is not None else "torch_dtype"
    dtype = cfg.get(dtype_field)
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ValueError(refusal(dtype_field, dtype, ", ".join(FLOAT_DTYPES)))
    return {
        "architecture": arch,
        "vocab_size": int(cfg["vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(cfg["intermediate_size"]),
        "num_hidden_layers": int(cfg["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": int(cfg.get("head_dim") or default_head_dim),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 2048)),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "rope": _parse_rope(cfg),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "hidden_act": hidden_act,
        "dtype": dtype,
    }


def _family_options(cfg: dict, arch: str) -> dict:
    """Biases, q/k norms, fused projections and the sliding window of one family."""
    attention_bias = (
        bool(cfg.get("attention_bias", False)) and "attention_bias" in FAMILY_FIELDS[arch]
    )
    return {
        "qkv_bias": attention_bias or arch == "Qwen2ForCausalLM",
        "o_bias": attention_bias,
        "mlp_bias": bool(cfg.get("mlp_bias", False)) and arch == "LlamaForCausalLM",
        "qk_norm": arch == "Qwen3ForCausalLM",
        "fused_projections": arch == "Phi3ForCausalLM",
        "sliding_window": _sliding_window(cfg, arch),
    }


def _sliding_window(cfg: dict, arch: str) -> int | None:
    """The window of the layers that use one, as transformers derives it (None: no layer does).

    Qwen2/Qwen3: ``layer_types`` when given, else layers from ``max_window_layers`` on when
    ``use_sliding_window``; Mistral/Phi-3: ``sliding_window`` for every layer; Gemma 2:
    ``layer_types``, by default every other layer from the first; Llama and Gemma: none.
    """
    if arch == "Gemma2ForCausalLM":
        window = cfg.get("sliding_window")
        uses = "sliding_attention" in _gemma2_layer_types(cfg)
        return int(window) if uses and window is not None else None
    if arch in ("MistralForCausalLM", "Phi3ForCausalLM"):
        window = cfg.get("sliding_window", 4096 if arch == "MistralForCausalLM" else None)
        return int(window) if window is not None else None
    if arch not in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        return None
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        num_layers = int(cfg["num_hidden_layers"])
        uses = window is not None and int(cfg.get("max_window_layers", 28)) < num_layers
    else:
        uses = "sliding_attention" in layer_types
    return int(window) if uses and window is not None else None


def _gemma2_layer_types(cfg: dict) -> list[str]:
    """Gemma 2's ``layer_types``; by default every other layer from the first slides
    (Gemma2Config.__post_init__)."""
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        return list(layer_types)
    num_layers = int(cfg["num_hidden_layers"])
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]


def _gemma_options(cfg: dict, arch: str) -> dict:
    """Gemma's scaled embedding and (1 + w) norms; Gemma 2's extra norms, scale and soft-caps.

    Raises:
        ValueError: ``use_bidirectional_attention`` is true (bidirectional attention), or
            ``query_pre_attn_scalar`` is not a positive number.
    """
    if arch not in GEMMA_ARCHITECTURES:
        return {}
    if cfg.get("use_bidirectional_attention"):
        value = cfg["use_bidirectional_attention"]
        raise ValueError(refusal("use_bidirectional_attention", value, "null, false"))
    options: dict = {"gemma_norms": True, "scale_embeddings": True}
    if arch == "Gemma2ForCausalLM":
        options["sandwich_norms"] = True
        scalar = cfg["query_pre_attn_scalar"]
        if not isinstance(scalar, int | float) or isinstance(scalar, bool) or scalar <= 0:
            raise ValueError(refusal("query_pre_attn_scalar", scalar, "a positive number"))
        options["query_pre_attn_scalar"] = float(scalar)
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            options[name] = float(cfg[name]) if cfg.get(name) is not None else None
        if cfg.get("sliding_window") is not None:
            options["window_layers"] = tuple(
                i for i, kind in enumerate(_gemma2_layer_types(cfg)) if kind == "sliding_attention"
            )
    return options


def _int8_group_size(quantization: object) -> int | None:
    """The group size of a zerolayer int8 ``quantization_config``; None for none.

    Raises:
        ValueError: another quantization method, bits other than 8, or a group size that is not
            a positive integer.
    """
    if quantization is None:
        return None
    supported = '{"quant_method": "zerolayer_int8", "bits": 8, "group_size": G}'
    if not isinstance(quantization, dict):
        raise ValueError(refusal("quantization_config", quantization, supported))
    group_size = quantization.get("group_size")
    if (
        quantization.get("quant_method") != QUANT_METHOD
        or quantization.get("bits", BITS) != BITS
        or not isinstance(group_size, int)
        or isinstance(group_size, bool)
        or group_size < 1
    ):
        raise ValueError(refusal("quantization_config", quantization, supported))
    return group_size


def _zerolayer_facts(cfg: dict) -> dict:
    """The ``zerolayer`` key: facts of the stored weights that no transformers field says (a
    GGUF file's config, :mod:`zerolayer.checkpoints.gguf.config_json`); {} when absent.

    Raises:
        ValueError: it is not a JSON object.
    """
    facts = cfg.get(ZEROLAYER_KEY) or {}
    if not isinstance(facts, dict):
        raise ValueError(refusal(ZEROLAYER_KEY, facts, "an object"))
    return facts


def _stored_layout(cfg: dict) -> dict:
    """The q/k row layout and Gemma's stored norm offset (:func:`_zerolayer_facts`)."""
    facts = _zerolayer_facts(cfg)
    return {
        "qk_rows_interleaved": bool(facts.get("qk_rows_interleaved", False)),
        "gemma_norm_offset_stored": bool(facts.get("gemma_norm_offset_stored", False)),
    }


def _tokens(cfg: dict, gen: dict) -> dict:
    return {
        "bos_token_id": _first_id(gen.get("bos_token_id", cfg.get("bos_token_id"))),
        "eos_token_ids": _ids(gen.get("eos_token_id", cfg.get("eos_token_id"))),
    }


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
    # NOTE: a legacy rope_scaling wins over rope_parameters, including its type ("type" or
    # "rope_type"): transformers 5 reads it so (a config saved by transformers 5 carries
    # rope_parameters {"rope_type": "default"} beside an edited rope_scaling).
    scaling_type = scaling.get("rope_type", scaling.get("type"))
    params.update(scaling)
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = scaling_type or params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ("default", "linear", "llama3"):
        raise ValueError(f"config.json: rope scaling type {rope_type!r} is not supported")
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(refusal("partial_rotary_factor", partial, "1.0"))
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
        freq_factors=tuple(float(f) for f in _zerolayer_facts(cfg).get("rope_freq_factors", ())),
    )
