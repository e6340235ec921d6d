"""A GGUF checkpoint (one file, or the parts of a split one) as the manifest the loader serves:
transformers' tensor names and row-major shapes, a synthesized config.json, the tokenizer files,
and every tensor where it lies in its file (mapped like safetensors, never read)."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import xxhash

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.config_json import (
    ROPE_FREQS,
    compute_dtype,
    config_dict,
    gguf_architecture,
)
from zerolayer.checkpoints.gguf.metadata import Metadata
from zerolayer.checkpoints.gguf.reader import GGUFFile, TensorInfo, read_gguf_file
from zerolayer.checkpoints.gguf.splits import SPLIT_NAME, check_splits, gguf_paths
from zerolayer.checkpoints.gguf.tensor_names import transformers_name
from zerolayer.checkpoints.gguf.tokenizer import tokenizer_files
from zerolayer.sharing.file_identity import FileIdentity
from zerolayer.sharing.manifest import HandleKind, TensorSpec, WeightManifest


def read_gguf_checkpoint(path: Path, model_name: str = "", dtype: str = "auto") -> WeightManifest:
    """Builds the manifest of the GGUF checkpoint at ``path`` without reading tensor data
    (only llama 3's ``rope_freqs.weight``, head_dim / 2 floats, is read into the config).

    Args:
        path: a ``.gguf`` file, a part of a split one, or a directory holding one (see
            :func:`~zerolayer.checkpoints.gguf.splits.gguf_paths`).
        model_name: the name it is served under; default the file's name without ``.gguf``
            (a split file's without its part number; a directory's name).
        dtype: ``--dtype``: "auto", "bfloat16" or "float32" (the compute dtype, written into
            the config as its ``dtype``).

    Raises:
        CheckpointError: one line naming the file and the metadata key or tensor that is bad
            (:func:`~.reader.read_gguf_file`, :func:`~.splits.check_splits`,
            :func:`~.config_json.config_dict`, :func:`~.tokenizer.tokenizer_files`), or a
            tensor that two parts hold.
        OSError: a file cannot be read.
    """
    given, path = path, path.resolve()
    paths = gguf_paths(path)
    files = [read_gguf_file(p) for p in paths]
    check_splits(files)
    meta = Metadata(files[0].metadata)
    try:
        arch = gguf_architecture(meta)
        tensors = _tensors_by_name(files)
        resolved = compute_dtype(dtype, [info for info, _ in tensors.values()])
        infos = {name: info for name, (info, _) in tensors.items()}
        config = config_dict(meta, infos, resolved, _rope_freq_factors(tensors, files))
        tokenizer_json, tokenizer_config_json = tokenizer_files(
            meta, config["max_position_embeddings"]
        )
    except CheckpointError as exc:
        raise CheckpointError(f"{paths[0]}: {exc}") from None
    config_json = json.dumps(config, indent=2) + "\n"
    specs = [
        TensorSpec(
            transformers_name(name, arch) or name,
            info.dtype,
            info.shape,
            file_index,
            info.offset_bytes,
            info.nbytes,
        )
        for name, (info, file_index) in tensors.items()
    ]
    identities = [FileIdentity.of(os.stat(f.path)) for f in files]
    return WeightManifest(
        model=model_name or _default_name(given if given.is_dir() else paths[0]),
        model_dir=str(paths[0].parent),
        config_json=config_json,
        generation_config_json="",
        tokenizer_json=tokenizer_json,
        tokenizer_config_json=tokenizer_config_json,
        fingerprint=_fingerprint(config_json, files, identities),
        handle_kind=HandleKind.MMAP_FILE,
        files=tuple(str(f.path) for f in files),
        file_sizes=tuple(i.size_bytes for i in identities),
        tensors=tuple(specs),
        num_parameters=sum(math.prod(s.shape) for s in specs),
        file_identities=tuple(identities),
    )


def _tensors_by_name(files: list[GGUFFile]) -> dict[str, tuple[TensorInfo, int]]:
    """Every tensor of the parts by GGUF name, with the index of its file.

    Raises:
        CheckpointError: two parts hold a tensor of the same name.
    """
    tensors: dict[str, tuple[TensorInfo, int]] = {}
    for index, f in enumerate(files):
        for info in f.tensors:
            if info.name in tensors:
                first = files[tensors[info.name][1]].path.name
                raise CheckpointError(f"tensor {info.name!r} is in both {first} and {f.path.name}")
            tensors[info.name] = (info, index)
    return tensors


def _rope_freq_factors(
    tensors: dict[str, tuple[TensorInfo, int]], files: list[GGUFFile]
) -> list[float]:
    """The values of ``rope_freqs.weight`` (F32, one dimension); [] when there is none.

    Raises:
        CheckpointError: it is not a one-dimensional F32 tensor.
    """
    if ROPE_FREQS not in tensors:
        return []
    info, file_index = tensors[ROPE_FREQS]
    if info.dtype != "F32" or len(info.shape) != 1:
        raise CheckpointError(
            f"tensor {ROPE_FREQS!r} is {info.dtype} {list(info.shape)}, not F32 [N]"
        )
    with open(files[file_index].path, "rb") as f:
        f.seek(info.offset_bytes)
        data = f.read(info.nbytes)
    return list(struct.unpack(f"<{info.shape[0]}f", data))


def _default_name(path: Path) -> str:
    """A directory's name, or a file's without ``.gguf`` (a split file's without its part)."""
    if path.is_dir():
        return path.name
    match = SPLIT_NAME.match(path.name)
    return match["prefix"] if match else path.name.removesuffix(".gguf")


def _fingerprint(config_json: str, files: list[GGUFFile], identities: list[FileIdentity]) -> str:
    """Hex digest over the config and each file's header (metadata and tensor infos), size and
    modification time."""
    digest = xxhash.xxh3_128(config_json.encode())
    for f, identity in zip(files, identities, strict=True):
        with open(f.path, "rb") as handle:
            digest.update(handle.read(f.data_offset))
        digest.update(struct.pack("<QQ", identity.size_bytes, identity.mtime_ns))
    return digest.hexdigest()
