"""The weight manifest: what the loader hands out and the scheduler maps (domain form)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from zerolayer.checkpoints.dtypes import TORCH_NAMES
from zerolayer.sharing.file_identity import FileIdentity

SAFETENSORS_NAMES = {torch: safetensors for safetensors, torch in TORCH_NAMES.items()}
"""torch dtype names (config.json's ``dtype``) -> safetensors names."""


class HandleKind(enum.IntEnum):
    """How tensor memory is passed between processes (mirrors zerolayer.v1.HandleKind)."""

    UNSPECIFIED = 0
    MMAP_FILE = 1
    CUDA_IPC = 2
    CUDA_VMM_FD = 3


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lives: ``nbytes`` bytes at ``offset_bytes`` of file ``file_index``."""

    name: str
    dtype: str
    """Safetensors dtype name ("F32", "BF16", ...)."""
    shape: tuple[int, ...]
    file_index: int
    offset_bytes: int
    nbytes: int
    device_offset_bytes: int = 0
    """CUDA handle kinds: byte offset in the manifest's ``device_memory``."""


@dataclass(frozen=True)
class DeviceMemoryHandle:
    """Device memory a layer exports (weights, KV arena); mirrors zerolayer.v1.DeviceMemoryHandle.

    ``CUDA_VMM_FD``: a ``cuMemCreate`` allocation whose POSIX file descriptor is served on
    ``fd_socket`` under ``handle_id`` (SCM_RIGHTS); it lives while any process holds it.
    ``CUDA_IPC``: a ``cudaMalloc`` allocation and its 64-byte ``cudaIpcMemHandle_t``; it dies with
    the exporting process.
    """

    kind: HandleKind
    device: str
    """"cuda:N" as the exporter sees it."""
    gpu_uuid: str
    size_bytes: int
    ipc_handle: bytes = b""
    fd_socket: str = ""
    handle_id: str = ""


@dataclass(frozen=True)
class WeightManifest:
    """A loaded checkpoint: its configs, tokenizer and tensor handles."""

    model: str
    model_dir: str
    config_json: str
    generation_config_json: str
    tokenizer_json: str
    tokenizer_config_json: str
    fingerprint: str
    """Hex digest over config.json and every file's header, size and mtime."""
    handle_kind: HandleKind
    files: tuple[str, ...]
    """Absolute paths of the weight files."""
    file_sizes: tuple[int, ...]
    tensors: tuple[TensorSpec, ...]
    num_parameters: int
    device_memory: DeviceMemoryHandle | None = None
    """Set for the CUDA handle kinds: the device copy of every tensor."""
    file_identities: tuple[FileIdentity, ...] = ()
    """Per file: the identity the loader mapped (empty from a loader that sends none); an
    importer opening ``files`` must find the same (see :mod:`zerolayer.sharing.file_identity`)."""
    chat_template_jinja: str = ""
    """Contents of chat_template.jinja; empty if the directory has none."""


@dataclass(frozen=True)
class Residency:
    """How much of the loader's weights is in memory (``GetResidency``, ``Prefetch``)."""

    total_bytes: int
    resident_bytes: int
    """Bytes of the weight files in the page cache."""
    num_layers: int
    num_layers_resident: int
    """Decoder layers whose weights are usable on ``device`` (all of them on CPU)."""
    device: str
    """Where the weights are served from: "cpu" or "cuda:N"."""


def model_dtype_name(manifest: WeightManifest) -> str:
    """The dtype the model computes and caches KV in, as a safetensors name ("BF16"):
    config.json's ``dtype`` (or ``torch_dtype``; a GGUF manifest's config always says it: the
    ``--dtype`` rule), else that of its embedding matrix (the checkpoint checks keep the two
    equal where both are given)."""
    config = json.loads(manifest.config_json) if manifest.config_json.strip() else {}
    name = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    if name in SAFETENSORS_NAMES:
        return SAFETENSORS_NAMES[name]
    for tensor in manifest.tensors:
        if tensor.name.endswith("embed_tokens.weight"):
            return tensor.dtype
    raise ValueError("checkpoint has no embed_tokens.weight")
