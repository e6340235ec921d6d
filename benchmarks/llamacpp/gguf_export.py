"""A Llama checkpoint written as a GGUF file, for llama.cpp to run the same weights.

Written with ``gguf.GGUFWriter`` (the ``gguf`` package of the ``bench`` extra): the ``llama``
architecture's metadata from config.json, Hugging Face tensor names mapped to GGUF's, the rows of
q_proj and k_proj permuted for llama.cpp's rotary embedding, and the weights in F32, BF16 or Q8_0
(``gguf.quants``). Norms stay F32, as llama.cpp's own converter keeps them.

Source: llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel``, ``ModelBase.prepare_tensors``) and
the GGUF specification (ggml's ``docs/gguf.md``); this module is written after them, not copied.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from zerolayer.checkpoints.model_config import ModelConfig

GGUF_TYPES = ("f32", "bf16", "q8_0")
"""The weight types :func:`export_gguf` writes (llama.cpp's ``--outtype`` names)."""

GGUF_TENSOR_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
"""Per-layer Hugging Face module name -> GGUF tensor name (``blk.N.<name>.weight``)."""

PRE_TOKENIZER = "default"
"""llama.cpp's pre-tokenizer for the byte tokenizer (its GPT-2 word split: with no merges, every
byte is its own token whatever the split, so text tokenizes as the Hugging Face tokenizer does)."""


def check_exportable(config: ModelConfig) -> None:
    """Raises ValueError unless ``config`` is a plain Llama: the ``llama`` architecture of GGUF
    has no biases, fused projections, q/k norms, sliding windows or RoPE scaling (as exported
    here)."""
    if config.architecture != "LlamaForCausalLM":
        raise ValueError(f"architecture {config.architecture!r}: only LlamaForCausalLM is exported")
    if config.rope.rope_type != "default":
        raise ValueError(f"rope_type {config.rope.rope_type!r}: RoPE scaling is not exported")
    extras = ("qkv_bias", "o_bias", "mlp_bias", "qk_norm", "fused_projections", "sliding_window")
    used = [name for name in extras if getattr(config, name)]
    if used or config.hidden_act != "silu":
        raise ValueError(f"{', '.join(used) or config.hidden_act}: not exported")


def rope_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorders the rows of a q_proj or k_proj weight from Hugging Face's rotary layout (each
    head's first half of dimensions pairs with its second half) to llama.cpp's ``llama`` layout
    (dimension pairs adjacent): row ``h*d + 2*i + j`` of the result is row ``h*d + j*d/2 + i`` of
    ``weight`` (``d`` the head dimension, ``j`` in {0, 1}).

    Args:
        weight: ``[num_heads * head_dim, in_features]``.
        num_heads: heads of this projection (key/value heads for k_proj).

    Returns:
        A new tensor of the same shape and dtype.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
        .contiguous()
    )


def gguf_tensors(
    weights: dict[str, torch.Tensor], shape: ModelConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors under their GGUF names, q/k rows permuted, in float32.

    ``output.weight`` is left out when the head is tied to the embedding (llama.cpp then reuses
    ``token_embd.weight``).

    Raises:
        KeyError: a tensor of the Llama layout is missing.
    """
    yield "token_embd.weight", weights["model.embed_tokens.weight"].float()
    for i in range(shape.num_hidden_layers):
        for hf_name, gguf_name in GGUF_TENSOR_NAMES.items():
            t = weights[f"model.layers.{i}.{hf_name}.weight"].float()
            if gguf_name == "attn_q":
                t = rope_permute(t, shape.num_attention_heads)
            elif gguf_name == "attn_k":
                t = rope_permute(t, shape.num_key_value_heads)
            yield f"blk.{i}.{gguf_name}.weight", t
    yield "output_norm.weight", weights["model.norm.weight"].float()
    if not shape.tie_word_embeddings and "lm_head.weight" in weights:
        yield "output.weight", weights["lm_head.weight"].float()


def quantized(name: str, tensor: torch.Tensor, gguf_type: str) -> tuple[np.ndarray, object]:
    """The tensor's data as ``gguf.quants.quantize`` encodes it and its ggml type: F32 for norms
    and 1-D tensors, else ``gguf_type`` (F32 when Q8_0 cannot split the rows in blocks of 32)."""
    import gguf

    data = tensor.numpy()
    qtype = {
        "f32": gguf.GGMLQuantizationType.F32,
        "bf16": gguf.GGMLQuantizationType.BF16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
    }[gguf_type]
    if data.ndim <= 1 or name.endswith("_norm.weight"):
        qtype = gguf.GGMLQuantizationType.F32
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:
        return data, gguf.GGMLQuantizationType.F32


def add_byte_tokenizer(writer: object, model_dir: Path, vocab_size: int) -> None:
    """Tokenizer metadata of the dummy models' byte-level BPE
    (:mod:`zerolayer.checkpoints.byte_tokenizer`), read from ``tokenizer.json``: its tokens in
    id order, ids past them up to ``vocab_size`` as unused ``[PADn]`` tokens (as llama.cpp's
    converter pads), special tokens as CONTROL, and BOS/EOS/UNK from tokenizer_config.json.

    NOTE: the byte tokenizer has no merges, but llama.cpp's BPE vocabulary needs the merges key
    and ``GGUFWriter`` refuses an empty array: the one merge written, of two special tokens'
    texts, can never apply (BPE symbols start as single characters and no other merge joins
    them), so tokenization is unchanged.

    Raises:
        ValueError: the tokenizer is not a BPE or has more tokens than ``vocab_size``.
    """
    import gguf

    spec = json.loads((model_dir / "tokenizer.json").read_text())
    if spec["model"]["type"] != "BPE":
        raise ValueError(f"tokenizer model {spec['model']['type']!r}: only BPE is exported")
    by_id = {i: text for text, i in spec["model"]["vocab"].items()}
    special = {t["id"]: t["content"] for t in spec.get("added_tokens", []) if t.get("special")}
    by_id.update(special)
    if max(by_id) >= vocab_size:
        raise ValueError(f"tokenizer has id {max(by_id)} >= vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"].get("merges", [])]
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    ids = {text: i for i, text in by_id.items()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges or [f"{config['bos_token']} {config['eos_token']}"])
    writer.add_bos_token_id(ids[config["bos_token"]])
    writer.add_eos_token_id(ids[config["eos_token"]])
    if config.get("unk_token") in ids:
        writer.add_unk_token_id(ids[config["unk_token"]])
    writer.add_add_bos_token(bool(config.get("add_bos_token", False)))


def add_llama_metadata(writer: object, shape: ModelConfig, name: str, gguf_type: str) -> None:
    """The ``llama`` architecture's hyperparameters and the file type."""
    import gguf

    writer.add_name(name)
    writer.add_context_length(shape.max_position_embeddings)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(shape.num_hidden_layers)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_attention_heads)
    writer.add_head_count_kv(shape.num_key_value_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope.theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    writer.add_vocab_size(shape.vocab_size)
    writer.add_file_type(
        {
            "f32": gguf.LlamaFileType.ALL_F32,
            "bf16": gguf.LlamaFileType.MOSTLY_BF16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        }[gguf_type]
    )


def export_gguf(model_dir: Path, out_path: Path, gguf_type: str) -> Path:
    """Writes the Llama checkpoint in ``model_dir`` (safetensors, byte-level BPE tokenizer) as
    the GGUF file ``out_path`` with weights of ``gguf_type`` (one of :data:`GGUF_TYPES`).

    Written to a temporary sibling and renamed, so a reader never sees half a file.

    Raises:
        ValueError: see :func:`check_exportable` and :func:`add_byte_tokenizer`, or an
            unknown ``gguf_type``.
        ImportError: the ``gguf`` package is not installed.
    """
    import gguf

    from zerolayer.bench.inprocess import LocalModel

    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"gguf_type {gguf_type!r}: one of {', '.join(GGUF_TYPES)}")
    model = LocalModel.load(model_dir)
    shape = model.config
    check_exportable(shape)
    weights = model.weights
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    add_llama_metadata(writer, shape, model_dir.name, gguf_type)
    add_byte_tokenizer(writer, model_dir, shape.vocab_size)
    for name, tensor in gguf_tensors(weights, shape):
        data, qtype = quantized(name, tensor, gguf_type)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out_path)
    return out_path


def ensure_gguf(model_dir: Path, cache_dir: Path, gguf_type: str) -> Path:
    """``<cache_dir>/<model dir name>-<gguf_type>.gguf``, exported by :func:`export_gguf` when
    missing or older than one of the checkpoint's safetensors files."""
    path = cache_dir / f"{model_dir.name}-{gguf_type}.gguf"
    newest = max(f.stat().st_mtime for f in model_dir.glob("*.safetensors"))
    if path.exists() and path.stat().st_mtime >= newest:
        return path
    return export_gguf(model_dir, path, gguf_type)
