"""The KV arena: one shared-memory file holding every layer's K and V blocks.

Layout (C-contiguous): ``[num_layers, 2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]``
of ``dtype``, so that the K (or V) cache of one layer is a contiguous
``[num_blocks, block_size, num_kv_heads, head_dim]`` array, the paged layout of vLLM
(Kwon et al. 2023, "Efficient Memory Management for LLM Serving with PagedAttention").

The arena outlives the kvstore process: a restarted kvstore reopens the same file (same inode,
so the scheduler's mapping stays valid) when a sidecar ``<path>.json`` records the same layout.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.common.dtypes import itemsize, torch_dtype

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ArenaLayout:
    """Geometry of a KV arena."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    """Tokens per block."""
    dtype: str
    """Safetensors dtype name of the elements."""
    num_blocks: int

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return itemsize(self.dtype)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers, K and V."""
        return (
            2
            * self.num_layers
            * self.block_size
            * self.num_kv_heads
            * self.head_dim
            * self.itemsize
        )

    @property
    def size_bytes(self) -> int:
        """Bytes of the whole arena."""
        return self.block_bytes * self.num_blocks

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the arena as one tensor."""
        return (
            self.num_layers,
            2,
            self.num_blocks,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
        )


def blocks_for_bytes(kv_cache_bytes: int, layout_without_blocks: ArenaLayout) -> int:
    """Number of whole blocks that fit in ``kv_cache_bytes``."""
    per_block = layout_without_blocks.block_bytes
    return kv_cache_bytes // per_block


def sidecar_path(path: str) -> str:
    """Where an arena's layout and id are recorded."""
    return path + ".json"


class Arena:
    """Owns the arena's shared-memory file.

    A new file is created sparse (``ftruncate``): tmpfs only backs the pages that get written.
    An existing file with a matching sidecar is reopened as it is (``reopened`` is True).

    Raises:
        ValueError: the layout has no blocks.
    """

    def __init__(self, path: str, layout: ArenaLayout) -> None:
        if layout.num_blocks <= 0:
            raise ValueError("kv_cache_bytes: too small for a single KV block")
        self.path = path
        self.layout = layout
        previous = self._read_sidecar()
        self.reopened = (
            previous is not None
            and previous.get("layout") == dataclasses.asdict(layout)
            and os.path.exists(path)
            and os.path.getsize(path) == layout.size_bytes
        )
        if self.reopened:
            self.arena_id = str(previous["arena_id"])
            return
        self.arena_id = uuid.uuid4().hex
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, layout.size_bytes)
        finally:
            os.close(fd)
        with open(sidecar_path(path), "w") as f:
            json.dump({"arena_id": self.arena_id, "layout": dataclasses.asdict(layout)}, f)

    def _read_sidecar(self) -> dict | None:
        try:
            with open(sidecar_path(self.path)) as f:
                return json.load(f)
        except (OSError, json.JSONDecodeError):
            return None

    def unlink(self) -> None:
        """Removes the shared-memory file and its sidecar (mappings stay valid until unmapped)."""
        for p in (self.path, sidecar_path(self.path)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def map_arena(path: str, layout: ArenaLayout) -> torch.Tensor:
    """Maps an arena file read-write and shared; returns it as a tensor of ``layout.shape``.

    Writes through the tensor land in the shared file (MAP_SHARED), visible to every process
    mapping it.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file's size does not match the layout.
    """
    size = os.path.getsize(path)
    if size != layout.size_bytes:
        raise ValueError(f"{path}: {size} bytes, layout needs {layout.size_bytes}")
    numel = layout.size_bytes // layout.itemsize
    import torch

    flat = torch.from_file(path, shared=True, size=numel, dtype=torch_dtype(layout.dtype))
    return flat.view(layout.shape)
