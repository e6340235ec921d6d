"""Reading a Hugging Face model directory: configs, tokenizer and safetensors headers.

Safetensors layout (huggingface/safetensors, "Format" in its README): 8 bytes little-endian u64
header size N, N bytes of UTF-8 JSON mapping tensor names to {dtype, shape, data_offsets: [begin,
end]} (offsets relative to the byte after the header) plus an optional "__metadata__" entry, then
the data. Only the header is read here; tensor bytes are mapped, never read.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import xxhash

from zerolayer.checkpoints.dtypes import itemsize
from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.splits import is_gguf_path
from zerolayer.checkpoints.model_hints import model_dir_hint
from zerolayer.checkpoints.shard_index import check_shards, read_weight_map
from zerolayer.sharing.file_identity import FileIdentity
from zerolayer.sharing.manifest import HandleKind, TensorSpec, WeightManifest

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_HEADER_BYTES = 100 * 1024 * 1024


__all__ = ["CheckpointError", "read_checkpoint", "read_safetensors_header", "weight_files"]


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """Reads the JSON header of a safetensors file.

    Returns:
        (header without "__metadata__", byte offset of the data section).

    Raises:
        CheckpointError: truncated file, oversized or invalid header, or out-of-range offsets.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise CheckpointError(f"{path}: too short for a safetensors file")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise CheckpointError(f"{path}: header length {header_len} is invalid")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    data_start = 8 + header_len
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
        ):
            raise CheckpointError(f"{path}: tensor {name!r} has no [begin, end] data_offsets")
        begin, end = offsets
        if not 0 <= begin <= end or data_start + end > size:
            raise CheckpointError(f"{path}: tensor {name!r} has offsets outside the file")
    return header, data_start


def weight_files(model_dir: Path, weight_map: dict[str, str] | None) -> list[Path]:
    """The safetensors files of a model directory, from its index when there is one.

    Args:
        model_dir: the model directory.
        weight_map: its index's tensor -> file map (:func:`read_weight_map`); None: no index.

    Raises:
        CheckpointError: no safetensors files; an index that is malformed or names a missing file
            or one outside ``model_dir`` (see :func:`read_weight_map`); or only pickled files
            (``*.bin``/``*.pt``), which are refused because unpickling runs arbitrary code (no
            ``torch.load`` of untrusted files).
    """
    if weight_map is not None:
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise CheckpointError(
            f"{model_dir}: only pickled checkpoints found ({', '.join(pickled)}); zerolayer "
            "refuses them because loading a pickle runs arbitrary code. Convert the model to "
            "safetensors (e.g. transformers' save_pretrained(..., safe_serialization=True)) "
            "in a trusted environment."
        )
    raise CheckpointError(f"{model_dir}: no *.safetensors files")


def _tensor_spec(
    path: Path, name: str, entry: dict, file_index: int, data_start: int
) -> TensorSpec:
    try:
        itemsize(entry["dtype"])
        shape = tuple(int(d) for d in entry["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{path}: tensor {name!r} has an invalid or unsupported dtype/shape ({exc})"
        ) from None
    begin, end = entry["data_offsets"]
    return TensorSpec(name, entry["dtype"], shape, file_index, data_start + begin, end - begin)


def _check_unique_tensors(files: list[Path], headers: list[dict]) -> None:
    """Refuses a tensor that two files hold (which one would be served is ambiguous)."""
    owner: dict[str, Path] = {}
    for path, header in zip(files, headers, strict=True):
        for name in header:
            if name in owner:
                raise CheckpointError(f"tensor {name!r} is in both {owner[name]} and {path}")
            owner[name] = path


def _index_name(model_dir: Path, path: Path, weight_map: dict[str, str]) -> str:
    """The index's spelling of ``path`` (``weight_files`` built it as ``model_dir / name``)."""
    return next(name for name in set(weight_map.values()) if model_dir / name == path)


def _read_optional(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def read_checkpoint(model_dir: Path, model_name: str = "", dtype: str = "auto") -> WeightManifest:
    """Builds the manifest of a Hugging Face model directory, or of a GGUF checkpoint, without
    reading tensor data.

    Args:
        model_dir: directory with config.json, tokenizer.json and safetensors file(s); or a GGUF
            file, or a directory with one (or with the parts of a split one) and no config.json
            (:func:`zerolayer.checkpoints.gguf.checkpoint.read_gguf_checkpoint`).
        model_name: name to serve the model under; default the directory's base name (a GGUF
            file's name without ``.gguf``).
        dtype: ``--dtype`` ("auto", "bfloat16", "float32"): a GGUF checkpoint's compute dtype;
            a safetensors one computes in its stored dtype (``check_weights`` refuses another).

    Raises:
        CheckpointError: not a directory or a required file is missing (with a hint for a
            llama2.c checkpoint, a hub id or a hub cache folder: :mod:`.model_hints`), a
            safetensors header is invalid, two files hold the same tensor, or the shards disagree
            with the index (see :func:`check_shards`).
    """
    if is_gguf_path(Path(model_dir)):
        # NOTE: imported here: it imports gguf and numpy, which a safetensors start never needs
        from zerolayer.checkpoints.gguf.checkpoint import read_gguf_checkpoint

        return read_gguf_checkpoint(Path(model_dir), model_name, dtype)
    given, model_dir = model_dir, model_dir.resolve()
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory{model_dir_hint(given)}")
    for required in ("config.json", "tokenizer.json"):
        if not (model_dir / required).exists():
            raise CheckpointError(f"{model_dir}: missing {required}{model_dir_hint(given)}")
    config_json = (model_dir / "config.json").read_text()
    weight_map = read_weight_map(model_dir)
    files = weight_files(model_dir, weight_map)
    digest = xxhash.xxh3_128(config_json.encode())
    headers = [read_safetensors_header(path) for path in files]
    _check_unique_tensors(files, [header for header, _ in headers])
    if weight_map is not None:
        names_by_file = {
            _index_name(model_dir, path, weight_map): list(header)
            for path, (header, _) in zip(files, headers, strict=True)
        }
        check_shards(model_dir, weight_map, names_by_file)
    tensors: list[TensorSpec] = []
    identities: list[FileIdentity] = []
    num_parameters = 0
    for file_index, (path, (header, data_start)) in enumerate(zip(files, headers, strict=True)):
        stat = os.stat(path)
        identities.append(FileIdentity.of(stat))
        digest.update(json.dumps(header, sort_keys=True).encode())
        digest.update(struct.pack("<QQ", stat.st_size, stat.st_mtime_ns))
        for name in sorted(header):
            spec = _tensor_spec(path, name, header[name], file_index, data_start)
            tensors.append(spec)
            shape = spec.shape
            num_parameters += math.prod(shape)
    return WeightManifest(
        model=model_name or model_dir.name,
        model_dir=str(model_dir),
        config_json=config_json,
        generation_config_json=_read_optional(model_dir / "generation_config.json"),
        tokenizer_json=(model_dir / "tokenizer.json").read_text(),
        tokenizer_config_json=_read_optional(model_dir / "tokenizer_config.json"),
        chat_template_jinja=_read_optional(model_dir / "chat_template.jinja"),
        fingerprint=digest.hexdigest(),
        handle_kind=HandleKind.MMAP_FILE,
        files=tuple(str(p) for p in files),
        file_sizes=tuple(i.size_bytes for i in identities),
        tensors=tuple(tensors),
        num_parameters=num_parameters,
        file_identities=tuple(identities),
    )
