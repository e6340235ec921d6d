"""A checkpoint of any family zerolayer serves written as a GGUF file, as llama.cpp's converter
writes it, for llama.cpp and for zerolayer's GGUF reader to run the same weights.

Written with ``gguf.GGUFWriter`` (the ``gguf`` package): the family's metadata
(:mod:`.gguf_metadata`) and tokenizer (:mod:`.gguf_vocab`), transformers' tensor names mapped to
GGUF's (:mod:`zerolayer.checkpoints.gguf.tensor_names`), and what the converter changes in the
weights: the rows of q_proj and k_proj (and their biases) of the ``llama`` architecture permuted
for llama.cpp's rotary embedding, Gemma's norm weights stored as 1 + w (computed in float32, as
transformers computes it), llama 3's RoPE scaling as the ``rope_freqs.weight`` divisors, the LM
head left out when tied. Norms and 1-D tensors stay F32, as llama.cpp keeps them; matrices are
F32, F16, BF16, Q8_0 or Q4_0 (``gguf.quants``). Optionally split (``split_max_tensors``: parts
``NAME-0000i-of-0000N.gguf``).

Source: llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel``, ``GemmaModel``,
``ModelBase.prepare_tensors``) and the GGUF specification (ggml's ``docs/gguf.md``); this module
is written after them, not copied.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from benchmarks.llamacpp.gguf_metadata import add_metadata, check_exportable, gguf_architecture_of
from benchmarks.llamacpp.gguf_vocab import (
    SentencePieceVocab,
    add_bpe_tokenizer,
    add_sentencepiece_tokenizer,
)
from zerolayer.checkpoints.gguf.tensor_names import gguf_name, layer_names
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.checkpoints.weight_check import expected_tensors

GGUF_TYPES = (
    "f32",
    "bf16",
    "f16",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "q4_k",
    "q5_k",
    "q6_k",
    "q4_k_m",
)
"""The weight types :func:`export_gguf` writes (llama.cpp's ``--outtype`` and ``llama-quantize``
names): gguf-py's quantizers, and the K-quants of :mod:`benchmarks.llamacpp.gguf_kquants`;
q4_k_m is llama.cpp's Q4_K_M mix as a simple rule (Q6_K for every attn_v, ffn_down and the
output, Q4_K elsewhere; llama.cpp gives Q6_K to some attn_v and ffn_down only)."""
LLAMA_LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm")
GGUF_TENSOR_NAMES = {
    hf: gguf
    for gguf, hf in layer_names("llama").items()
    if gguf in LLAMA_LAYER_TENSORS or gguf.startswith("ffn_")
}
"""Per-layer Hugging Face module name -> GGUF tensor name of a Llama (``blk.N.<name>.weight``)."""
K_QUANT_FALLBACKS = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
"""llama.cpp's type for a K-quant tensor whose rows are not whole super-blocks of 256
(llama-quant.cpp: ``tensor_type_fallback``; F16 where the rows are not whole blocks of 32)."""


def rope_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorders the rows of a q_proj or k_proj weight (or bias) from Hugging Face's rotary
    layout (each head's first half of dimensions pairs with its second half) to llama.cpp's
    ``llama`` layout (dimension pairs adjacent): row ``h*d + 2*i + j`` of the result is row
    ``h*d + j*d/2 + i`` of ``weight`` (``d`` the head dimension, ``j`` in {0, 1}).

    Args:
        weight: ``[num_heads * head_dim, ...]``.
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


def rope_freqs(config: ModelConfig) -> torch.Tensor:
    """llama 3's RoPE scaling as llama.cpp's converter writes it: per frequency, the divisor of
    the unscaled frequency (1, ``factor``, or the smooth blend between), float32 [head_dim / 2]
    (``LlamaModel.generate_extra_tensors``)."""
    rope = config.rope
    dim = config.head_dim
    freqs = 1.0 / (rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low = rope.original_max_position_embeddings / rope.low_freq_factor
    high = rope.original_max_position_embeddings / rope.high_freq_factor
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high:
            factors.append(1.0)
        elif wavelen > low:
            factors.append(rope.factor)
        else:
            smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
                rope.high_freq_factor - rope.low_freq_factor
            )
            factors.append(1 / ((1 - smooth) / rope.factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def gguf_tensors(
    weights: dict[str, torch.Tensor], config: ModelConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors the forward reads, under their GGUF names, as the converter changes them
    (module docstring), in float32.

    Raises:
        KeyError: a tensor of the family's layout is missing.
    """
    arch = gguf_architecture_of(config)
    for name in expected_tensors(config):
        t = weights[name].float()
        if arch == "llama" and ".q_proj." in name:
            t = rope_permute(t, config.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            t = rope_permute(t, config.num_key_value_heads)
        elif arch in ("gemma", "gemma2") and name.endswith("norm.weight"):
            t = t + 1.0
        yield gguf_name(name, arch), t
    if config.rope.rope_type == "llama3":
        yield "rope_freqs.weight", rope_freqs(config)


def tensor_type(name: str, shape: tuple[int, ...], gguf_type: str) -> str:
    """The ggml type name a tensor ``name`` (its GGUF name) of ``shape`` is written in: F32 for
    norms and 1-D tensors; a K-quant's rows that are not whole super-blocks fall back as
    llama.cpp's (:data:`K_QUANT_FALLBACKS`), to F16 if not whole blocks of 32; gguf-py's other
    quantized types to F32 where the rows are not whole blocks.

    Raises:
        ValueError: an unknown ``gguf_type``.
    """
    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"gguf_type {gguf_type!r}: one of {', '.join(GGUF_TYPES)}")
    if len(shape) <= 1 or name.endswith("_norm.weight"):
        return "F32"
    qtype = gguf_type.upper()
    if gguf_type == "q4_k_m":
        sixes = (".attn_v.", ".ffn_down.", "output.weight")
        qtype = (
            "Q6_K"
            if any(part in name for part in sixes) and name != "token_embd.weight"
            else "Q4_K"
        )
    if qtype in K_QUANT_FALLBACKS and shape[-1] % 256:
        qtype = K_QUANT_FALLBACKS[qtype] if shape[-1] % 32 == 0 else "F16"
    if qtype.startswith("Q") and shape[-1] % 32:
        return "F32"
    return qtype


def quantized(name: str, tensor: torch.Tensor, gguf_type: str) -> tuple[np.ndarray, object]:
    """The tensor's data as the GGUF file holds it (``gguf.quants.quantize``, or
    :func:`~benchmarks.llamacpp.gguf_kquants.quantize` for the K-quants) and its ggml type
    (:func:`tensor_type`).

    Raises:
        ValueError: an unknown ``gguf_type``.
    """
    import gguf

    from benchmarks.llamacpp.gguf_kquants import quantize

    data = tensor.numpy()
    qtype = tensor_type(name, tuple(data.shape), gguf_type)
    if qtype == "F32":
        return data, gguf.GGMLQuantizationType.F32
    if qtype in ("F16", "BF16"):
        return gguf.quants.quantize(
            data, gguf.GGMLQuantizationType[qtype]
        ), gguf.GGMLQuantizationType[qtype]
    return quantize(data, qtype), gguf.GGMLQuantizationType[qtype]


def export_gguf(
    model_dir: Path,
    out_path: Path,
    gguf_type: str,
    *,
    vocab: SentencePieceVocab | None = None,
    pre_tokenizer: str = "default",
    split_max_tensors: int = 0,
) -> Path:
    """Writes the checkpoint in ``model_dir`` (safetensors) as the GGUF file ``out_path`` with
    matrices of ``gguf_type`` (one of :data:`GGUF_TYPES`).

    Args:
        vocab: a SentencePiece vocabulary to write ("llama"); None: the directory's BPE
            tokenizer.json ("gpt2", with ``pre_tokenizer``).
        split_max_tensors: > 0: split into parts of at most this many tensors; the return value
            is then the first part's path.

    Written to temporary siblings and renamed, so a reader never sees half a file.

    Raises:
        ValueError: see :func:`~.gguf_metadata.check_exportable`, :func:`quantized` and the
            tokenizer writers.
        ImportError: the ``gguf`` package is not installed.
    """
    import gguf

    from zerolayer.bench.inprocess import LocalModel

    model = LocalModel.load(model_dir)
    config = model.config
    check_exportable(config)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name("tmp-" + out_path.name)
    writer = gguf.GGUFWriter(
        str(tmp), gguf_architecture_of(config), split_max_tensors=split_max_tensors
    )
    add_metadata(writer, config, model_dir.name, gguf_type)
    if vocab is not None:
        add_sentencepiece_tokenizer(writer, vocab, config.vocab_size)
    else:
        add_bpe_tokenizer(
            writer,
            (model_dir / "tokenizer.json").read_text(),
            (model_dir / "tokenizer_config.json").read_text(),
            config.vocab_size,
            pre_tokenizer,
        )
    for name, tensor in gguf_tensors(model.weights, config):
        data, qtype = quantized(name, tensor, gguf_type)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = writer.format_shard_names(tmp)
    for part in parts:
        part.replace(part.with_name(part.name.removeprefix("tmp-")))
    return parts[0].with_name(parts[0].name.removeprefix("tmp-"))


def ensure_gguf(model_dir: Path, cache_dir: Path, gguf_type: str) -> Path:
    """``<cache_dir>/<model dir name>-<gguf_type>.gguf``, exported by :func:`export_gguf` when
    missing or older than one of the checkpoint's safetensors files."""
    path = cache_dir / f"{model_dir.name}-{gguf_type}.gguf"
    newest = max(f.stat().st_mtime for f in model_dir.glob("*.safetensors"))
    if path.exists() and path.stat().st_mtime >= newest:
        return path
    return export_gguf(model_dir, path, gguf_type)
