"""A GGUF file's metadata as the transformers-style config.json the rest of the stack reads.

The keys are llama.cpp's (``src/llama-arch.cpp``'s ``LLM_KV_*``, gguf-py's ``Keys``), read as
``llama_model_loader`` reads them for each family (``src/models/<arch>.cpp``), with its defaults;
what llama.cpp's converter (``convert_hf_to_gguf.py``, ``conversion/*.py``) changed in the weights
is said in the ``zerolayer`` key (:data:`ZEROLAYER_KEY`) for the forward to honour:

- ``llama``: the q and k projection rows are permuted for llama.cpp's interleaved rotary
  embedding (``LlamaModel.permute``): ``qk_rows_interleaved``;
- ``gemma``, ``gemma2``: norm weights are stored as 1 + w: ``gemma_norm_offset_stored``;
- llama 3's RoPE scaling is the ``rope_freqs.weight`` tensor of per-frequency divisors:
  ``rope_freq_factors``.

Mistral files are ``llama`` (the converter registers ``MistralForCausalLM`` as ``LlamaModel``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.metadata import Metadata
from zerolayer.checkpoints.gguf.reader import TensorInfo
from zerolayer.checkpoints.gguf.tensor_names import ALWAYS_TIED
from zerolayer.checkpoints.model_config import ZEROLAYER_KEY

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
}
"""``general.architecture`` -> the transformers architecture it is served as."""
DTYPES = ("auto", "bfloat16", "float32")
"""``--dtype`` values: auto is float32 when every matrix is F32, else bfloat16."""
ROPE_FREQS = "rope_freqs.weight"
"""llama 3's per-frequency RoPE divisors (``LLM_TENSOR_ROPE_FREQS``)."""
REFUSED_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
"""Phi-3's LongRoPE factors: zerolayer serves no LongRoPE."""
GEMMA2_27B_LAYERS = 46
"""llama.cpp scales Gemma 2 27B's queries by (hidden / heads) ** -0.5, the others' by
head_dim ** -0.5 (``llama_model_gemma2::load_arch_hparams``); GGUF stores no scalar."""


def gguf_architecture(meta: Metadata) -> str:
    """``general.architecture``, if zerolayer serves it.

    Raises:
        CheckpointError: missing, or an architecture zerolayer does not serve.
    """
    arch = meta.string("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"metadata key 'general.architecture' is {arch!r}, which zerolayer does not serve "
            f"(served: {', '.join(ARCHITECTURES)})"
        )
    return arch


def compute_dtype(requested: str, tensors: Sequence[TensorInfo]) -> str:
    """The dtype the activations and the KV cache are in: ``requested`` ("bfloat16",
    "float32"), or for "auto" float32 when every matrix (2-D tensor) is F32, else bfloat16.

    Raises:
        CheckpointError: ``requested`` is not one of :data:`DTYPES`.
    """
    if requested not in DTYPES:
        raise CheckpointError(f"--dtype {requested!r}: one of {', '.join(DTYPES)}")
    if requested != "auto":
        return requested
    matrices = [t for t in tensors if len(t.shape) == 2]
    return "float32" if all(t.dtype == "F32" for t in matrices) else "bfloat16"


def config_dict(
    meta: Metadata,
    tensors: Mapping[str, TensorInfo],
    dtype: str,
    rope_freq_factors: Sequence[float] = (),
) -> dict:
    """The config.json of the GGUF file (``tensors`` by GGUF name), computing in ``dtype``.

    Raises:
        CheckpointError: one line naming the metadata key or tensor: an architecture zerolayer
            does not serve, a missing or mistyped hyperparameter, KV heads that do not divide
            the heads, a value length other than the key length, partial rotary dimensions,
            a RoPE scaling other than none or linear, experts, LongRoPE factors, or
            ``rope_freqs.weight`` of another length than head_dim / 2.
    """
    arch = gguf_architecture(meta)
    for name in REFUSED_TENSORS:
        if name in tensors:
            raise CheckpointError(f"tensor {name!r}: LongRoPE is not served")
    if meta.integer(f"{arch}.expert_count", 0):
        raise CheckpointError(
            f"metadata key '{arch}.expert_count': mixtures of experts are not served"
        )
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        **_shapes(meta, arch, tensors),
        **_biases(arch, tensors),
        **_window(meta, arch),
        "dtype": dtype,
        **_tokens(meta),
    }
    config.update(_rope(meta, arch, config["head_dim"]))
    if arch == "gemma2":
        config.update(_gemma2(meta, config))
    if arch in ("gemma", "gemma2"):
        config["hidden_act" if arch == "gemma" else "hidden_activation"] = "gelu_pytorch_tanh"
    config[ZEROLAYER_KEY] = _zerolayer(arch, config["head_dim"], rope_freq_factors)
    return config


def _shapes(meta: Metadata, arch: str, tensors: Mapping[str, TensorInfo]) -> dict:
    """The shape fields (``<arch>.embedding_length`` ...), checked against each other."""
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise CheckpointError("tensor 'token_embd.weight' is missing")
    hidden = meta.integer(f"{arch}.embedding_length")
    heads = meta.integer(f"{arch}.attention.head_count")
    kv_heads = meta.integer(f"{arch}.attention.head_count_kv", heads)
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise CheckpointError(
            f"metadata key '{arch}.attention.head_count_kv' is {kv_heads}, not a divisor of "
            f"'{arch}.attention.head_count' ({heads})"
        )
    head_dim = meta.integer(f"{arch}.attention.key_length", hidden // heads)
    value_dim = meta.integer(f"{arch}.attention.value_length", head_dim)
    if value_dim != head_dim:
        raise CheckpointError(
            f"metadata key '{arch}.attention.value_length' is {value_dim}, not the key length "
            f"{head_dim}"
        )
    return {
        "vocab_size": meta.integer(f"{arch}.vocab_size", embedding.shape[0]),
        "hidden_size": hidden,
        "intermediate_size": meta.integer(f"{arch}.feed_forward_length"),
        "num_hidden_layers": meta.integer(f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": meta.integer(f"{arch}.context_length"),
        "rms_norm_eps": meta.number(f"{arch}.attention.layer_norm_rms_epsilon"),
        "tie_word_embeddings": "output.weight" not in tensors or arch in ALWAYS_TIED,
        "hidden_act": "silu",
    }


def _biases(arch: str, tensors: Mapping[str, TensorInfo]) -> dict:
    """transformers' bias switches, from the first layer's tensors (Qwen2 always has q/k/v
    biases)."""
    if arch == "qwen2":
        return {}
    biases = {"attention_bias": "blk.0.attn_q.bias" in tensors}
    if arch == "llama":
        biases["mlp_bias"] = "blk.0.ffn_gate.bias" in tensors
    return biases


def _window(meta: Metadata, arch: str) -> dict:
    """Phi-3's sliding window (0: none); Gemma 2's (llama.cpp's default 4096)."""
    key = f"{arch}.attention.sliding_window"
    if arch == "phi3":
        return {"sliding_window": meta.integer(key, 0) or None}
    if arch == "gemma2":
        return {"sliding_window": meta.integer(key, 4096)}
    return {}


def _rope(meta: Metadata, arch: str, head_dim: int) -> dict:
    """``rope_theta`` and ``rope_scaling`` (none or linear).

    Raises:
        CheckpointError: ``<arch>.rope.dimension_count`` other than head_dim (partial rotary),
            or a scaling type other than none and linear.
    """
    dims = meta.integer(f"{arch}.rope.dimension_count", head_dim)
    if dims != head_dim:
        raise CheckpointError(
            f"metadata key '{arch}.rope.dimension_count' is {dims}, not head_dim {head_dim} "
            "(partial rotary embeddings are not served)"
        )
    rope: dict = {"rope_theta": meta.number(f"{arch}.rope.freq_base", 10000.0)}
    kind = meta.string(f"{arch}.rope.scaling.type", "none")
    factor = meta.number(
        f"{arch}.rope.scaling.factor", meta.number(f"{arch}.rope.scale_linear", 1.0)
    )
    if kind not in ("none", "linear"):
        raise CheckpointError(
            f"metadata key '{arch}.rope.scaling.type' is {kind!r} (served: none, linear)"
        )
    if kind == "linear" or factor != 1.0:
        rope["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    return rope


def _gemma2(meta: Metadata, config: dict) -> dict:
    """Gemma 2's soft-caps (llama.cpp's defaults 50 and 30), query scale and sliding layers
    (every ``sliding_window_pattern``-th layer is global, by default every second)."""
    layers = config["num_hidden_layers"]
    pattern = meta.integer("gemma2.attention.sliding_window_pattern", 2)
    if layers == GEMMA2_27B_LAYERS:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    else:
        scalar = config["head_dim"]
    return {
        "attn_logit_softcapping": meta.number("gemma2.attn_logit_softcapping", 50.0),
        "final_logit_softcapping": meta.number("gemma2.final_logit_softcapping", 30.0),
        "query_pre_attn_scalar": scalar,
        "layer_types": [
            "sliding_attention" if i % pattern < pattern - 1 else "full_attention"
            for i in range(layers)
        ],
    }


def _tokens(meta: Metadata) -> dict:
    """BOS and the end-of-generation ids (EOS, and EOT and EOM when the file names them)."""
    eos = [meta.integer(f"tokenizer.ggml.{kind}_token_id", None) for kind in ("eos", "eot", "eom")]
    return {
        "bos_token_id": meta.integer("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": list(dict.fromkeys(i for i in eos if i is not None)),
    }


def _zerolayer(arch: str, head_dim: int, rope_freq_factors: Sequence[float]) -> dict:
    """What GGUF changed in the weights (module docstring).

    Raises:
        CheckpointError: ``rope_freqs.weight`` does not hold head_dim / 2 factors.
    """
    if rope_freq_factors and len(rope_freq_factors) != head_dim // 2:
        raise CheckpointError(
            f"tensor {ROPE_FREQS!r} has {len(rope_freq_factors)} factors, head_dim {head_dim} "
            f"implies {head_dim // 2}"
        )
    return {
        "format": "gguf",
        "gguf_architecture": arch,
        "qk_rows_interleaved": arch == "llama",
        "gemma_norm_offset_stored": arch in ("gemma", "gemma2"),
        "rope_freq_factors": [float(f) for f in rope_freq_factors],
    }
