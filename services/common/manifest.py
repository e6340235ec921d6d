"""The weight manifest: what the loader hands out and the scheduler maps (domain form)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


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
