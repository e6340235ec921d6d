"""GGUF files for the tests: every served family written from its tiny transformers checkpoint
(:mod:`scheduler.model.family_checkpoints`) by the bench's exporter
(:mod:`benchmarks.llamacpp.gguf_export`), stories260K with its SentencePiece vocabulary, and the
byte patches that make each kind of bad file."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
from scheduler.model.family_checkpoints import FAMILIES, write_family_checkpoint

from benchmarks.llamacpp.gguf_export import export_gguf
from benchmarks.llamacpp.gguf_vocab import llama2c_vocab
from zerolayer.checkpoints.llama2c import convert_llama2c, read_tokenizer

GGUF_FAMILY_CHANGES: dict[str, dict] = {
    # GGUF's llama has no activation key (llama.cpp's is SiLU).
    "llama-bias": {"hidden_act": "silu"},
    # llama.cpp scales Gemma 2's queries by head_dim ** -0.5 and ties its LM head.
    "gemma2": {"query_pre_attn_scalar": 16, "tie_word_embeddings": True},
}
"""Per family, the config changes that make its tiny checkpoint one GGUF metadata can say."""
GGUF_FAMILIES = sorted(FAMILIES)
SUPER_BLOCK_SHAPES = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "head_dim": 64,
    "vocab_size": 512,
}
"""The changes that make a family's tiny checkpoint a llama (mistral's GGUF architecture, q/k rows
interleaved) whose rows are whole K-quant super-blocks of 256."""


def family_gguf(
    root: Path, family: str, dtype: str = "float32", gguf_type: str = "f32", **export: object
) -> tuple[Path, Path]:
    """(transformers checkpoint, GGUF file of it) of ``family``'s tiny model in ``dtype``, its
    matrices written as ``gguf_type``; ``export``: :func:`export_gguf`'s keywords."""
    seed = GGUF_FAMILIES.index(family)
    model_dir = root / f"{family}-{dtype}"
    if not model_dir.exists():
        write_family_checkpoint(
            model_dir, family, dtype, seed, **GGUF_FAMILY_CHANGES.get(family, {})
        )
    path = export_gguf(model_dir, root / f"{family}-{dtype}-{gguf_type}.gguf", gguf_type, **export)
    return model_dir, path


def dequantized_checkpoint(model_dir: Path, gguf_type: str, out_dir: Path) -> Path:
    """``model_dir`` (a float32 transformers checkpoint) with every tensor its GGUF file of
    ``gguf_type`` holds replaced by those values dequantized (``gguf.quants.dequantize``):
    transformers on it computes what zerolayer computes on the file. In transformers' layout:
    each row is quantized on its own, so llama's permutation of the q/k rows commutes with it.
    Returns ``out_dir``."""
    import shutil

    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    from benchmarks.llamacpp.gguf_export import quantized
    from benchmarks.llamacpp.gguf_metadata import gguf_architecture_of
    from zerolayer.checkpoints.gguf.tensor_names import gguf_name
    from zerolayer.checkpoints.model_config import ModelConfig
    from zerolayer.checkpoints.weight_check import expected_tensors

    config = ModelConfig.from_json((model_dir / "config.json").read_text())
    arch = gguf_architecture_of(config)
    shutil.copytree(model_dir, out_dir)
    tensors = load_file(str(model_dir / "model.safetensors"))
    for name in expected_tensors(config):
        data, qtype = quantized(gguf_name(name, arch), tensors[name].float(), gguf_type)
        values = gguf.quants.dequantize(data, qtype).astype(np.float32)
        tensors[name] = torch.from_numpy(values.reshape(tensors[name].shape))
    save_file(tensors, str(out_dir / "model.safetensors"))
    return out_dir


def stories_gguf(stories_dir: Path, root: Path) -> tuple[Path, Path]:
    """(llama2.c's stories260K converted to safetensors, the same as a GGUF file with its
    SentencePiece vocabulary: tokens, scores and types, ``tokenizer.ggml.model`` "llama")."""
    converted = root / "stories260K"
    convert_llama2c(stories_dir / "stories260K.bin", stories_dir / "tok512.bin", converted)
    pieces, scores = read_tokenizer(stories_dir / "tok512.bin", 512)
    path = export_gguf(
        converted, root / "stories260K.gguf", "f32", vocab=llama2c_vocab(pieces, scores)
    )
    return converted, path


def _field(path: Path, key: str) -> gguf.ReaderField:
    field = gguf.GGUFReader(path).get_field(key)
    assert field is not None, key
    return field


def value_offset(path: Path, key: str) -> int:
    """Byte offset of the value of metadata key ``key`` (a scalar: its bytes; a string: its
    length)."""
    field = _field(path, key)
    return field.offset + 8 + len(key.encode()) + 4


def patch(path: Path, offset: int, data: bytes) -> None:
    """Overwrites ``len(data)`` bytes of ``path`` at ``offset``."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def patch_u32(path: Path, key: str, value: int) -> None:
    """Sets the u32 metadata value of ``key``."""
    patch(path, value_offset(path, key), struct.pack("<I", value))


def patch_string(path: Path, key: str, value: str) -> None:
    """Sets the string value of ``key`` to ``value`` (of the same length)."""
    offset = value_offset(path, key)
    old = _field(path, key).contents()
    assert len(value.encode()) == len(old.encode()), (old, value)
    patch(path, offset + 8, value.encode())


def rename_key(path: Path, key: str, new_key: str) -> None:
    """Renames metadata key ``key`` to ``new_key`` (of the same length): ``key`` is then
    missing."""
    assert len(new_key) == len(key)
    patch(path, _field(path, key).offset + 8, new_key.encode())


def tensor_info_offsets(path: Path, name: str) -> tuple[int, int]:
    """(offset of the ggml type, offset of the data offset) in the info of tensor ``name``."""
    reader = gguf.GGUFReader(path)
    tensor = next(t for t in reader.tensors if t.name == name)
    start = tensor.field.offset + 8 + len(name.encode()) + 4 + 8 * len(tensor.shape)
    return start, start + 4
