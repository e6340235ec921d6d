"""The hyperparameters of a checkpoint as GGUF metadata, for every family zerolayer serves.

Written as llama.cpp's converter writes them (``convert_hf_to_gguf.py``: ``TextModel.
set_gguf_parameters`` and each family's class in ``conversion/``), so that llama.cpp and
zerolayer's GGUF reader (:mod:`zerolayer.checkpoints.gguf.config_json`, its inverse) read the
model transformers computes. Source: those files, read, not copied.
"""

from __future__ import annotations

from zerolayer.checkpoints.gguf.config_json import ARCHITECTURES, GEMMA2_27B_LAYERS
from zerolayer.checkpoints.model_config import ModelConfig

GGUF_ARCHITECTURES = {
    **{hf: gguf for gguf, hf in ARCHITECTURES.items()},
    "MistralForCausalLM": "llama",
}
"""transformers architecture -> ``general.architecture`` (Mistral is ``llama`` in GGUF)."""
FILE_TYPES = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "q5_0": 8,
    "q5_1": 9,
    "q4_k": 14,
    "q4_k_m": 15,
    "q5_k": 16,
    "q6_k": 18,
    "bf16": 32,
}
"""llama.cpp's ``llama_ftype`` of each exported weight type (``general.file_type``; q4_k and q5_k
as Q4_K_S and Q5_K_S, the files of mostly that type)."""


def gguf_architecture_of(config: ModelConfig) -> str:
    """The GGUF architecture of ``config``'s family.

    Raises:
        ValueError: a family GGUF has no architecture for.
    """
    if config.architecture not in GGUF_ARCHITECTURES:
        raise ValueError(f"architecture {config.architecture!r}: not exported")
    return GGUF_ARCHITECTURES[config.architecture]


def check_exportable(config: ModelConfig) -> None:
    """Raises ValueError for what GGUF metadata cannot say of ``config``: an activation other
    than the family's (SiLU; Gemma's tanh GELU), a RoPE scaling other than linear and llama3, a
    sliding window where llama.cpp has none (Llama, Qwen), an untied Gemma, a Gemma 2 query
    scale or window pattern other than llama.cpp's, or an int8 checkpoint."""
    arch = gguf_architecture_of(config)
    gemma = arch in ("gemma", "gemma2")
    if config.hidden_act != ("gelu_pytorch_tanh" if gemma else "silu"):
        raise ValueError(f"hidden_act {config.hidden_act!r}: GGUF {arch} has no other")
    if config.rope.rope_type not in ("default", "linear", "llama3"):
        raise ValueError(f"rope_type {config.rope.rope_type!r}: RoPE scaling is not exported")
    windowed = config.sliding_window is not None and (
        config.sliding_window < config.max_position_embeddings
    )
    if windowed and arch in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"sliding_window {config.sliding_window}: GGUF {arch} has none")
    if gemma and not config.tie_word_embeddings:
        raise ValueError(f"tie_word_embeddings false: GGUF {arch}'s LM head is the embedding")
    if config.int8_group_size is not None:
        raise ValueError("an int8 checkpoint (zerolayer quantize): not exported")
    if arch == "gemma2":
        heads = config.num_attention_heads
        big = config.num_hidden_layers == GEMMA2_27B_LAYERS
        scalar = config.hidden_size // heads if big else config.head_dim
        if config.query_pre_attn_scalar != scalar:
            raise ValueError(
                f"query_pre_attn_scalar {config.query_pre_attn_scalar}: llama.cpp uses {scalar}"
            )
        pattern = tuple(range(0, config.num_hidden_layers, 2))
        if config.window_layers != pattern:
            raise ValueError("Gemma 2 layer_types: llama.cpp slides every other layer")


def add_metadata(writer: object, config: ModelConfig, name: str, gguf_type: str) -> None:
    """``general.*`` and the architecture's hyperparameters (``<arch>.*``)."""
    c = config
    arch = gguf_architecture_of(c)
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[gguf_type])
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(c.rope.theta)
    if c.rope.rope_type == "linear":
        import gguf

        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(c.rope.factor)
    if arch == "phi3":
        writer.add_sliding_window(c.sliding_window or 0)
        writer.add_rope_scaling_orig_ctx_len(c.rope.original_max_position_embeddings)
    if arch == "gemma2":
        writer.add_sliding_window(c.sliding_window or 4096)
        writer.add_attn_logit_softcapping(c.attn_logit_softcapping or 0.0)
        writer.add_final_logit_softcapping(c.final_logit_softcapping or 0.0)
