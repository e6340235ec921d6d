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

from zerolayer.checkpoints.dtypes import itemsize, torch_dtype

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


class ArenaSizeError(ValueError):
    """The arena cannot be made: ``kv_cache_bytes`` holds no whole block, or the arena's
    filesystem cannot hold it. ``reason`` says which, without the field name."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"kv_cache_bytes: {reason}")
        self.reason = reason


def free_bytes(path: str) -> int:
    """Bytes an unprivileged process can still allocate on the filesystem holding ``path`` (a
    file or a directory), from ``statvfs``."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def check_arena_fits(path: str, size_bytes: int) -> None:
    """Checks that an arena of ``size_bytes`` fits the free space of the filesystem holding
    ``path`` (the arena file, or the directory it will be created in; e.g. Docker's default
    64 MB ``/dev/shm``).

    Raises:
        ArenaSizeError: it does not fit; the message names the path and the free bytes.
    """
    free = free_bytes(path)
    if size_bytes > free:
        raise ArenaSizeError(
            f"the KV arena needs {size_bytes} bytes at {path}, but only {free} bytes are free there"
        )


class Arena:
    """Owns the arena's shared-memory file.

    A new file has all its pages reserved up front (``posix_fallocate``): a sparse file on a
    tmpfs smaller than the arena would let the scheduler's first write to a page beyond the free
    space die of SIGBUS, and a restarted scheduler die again the same way. An existing file with
    a matching sidecar is reopened as it is (``reopened`` is True, contents kept).

    Raises:
        ArenaSizeError: the layout has no blocks, or the filesystem cannot hold the arena (the
            partly created file is removed again).
    """

    def __init__(self, path: str, layout: ArenaLayout) -> None:
        if layout.num_blocks <= 0:
            raise ArenaSizeError("too small for a single KV block")
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
        try:
            self._create()
        except ArenaSizeError:
            self.unlink()
            raise
        with open(sidecar_path(path), "w") as f:
            json.dump({"arena_id": self.arena_id, "layout": dataclasses.asdict(self.layout)}, f)

    def _create(self) -> None:
        """Creates the file (emptying an old one first) and reserves every page of it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # NOTE: checked after O_TRUNC, which gives back the pages of an arena of another layout.
            check_arena_fits(self.path, self.layout.size_bytes)
            # Sets the size too; on tmpfs it fails with ENOSPC, giving back what it took.
            os.posix_fallocate(fd, 0, self.layout.size_bytes)
        except OSError as exc:
            raise ArenaSizeError(
                f"cannot reserve the {self.layout.size_bytes} bytes of the KV arena at {self.path}"
                f" ({exc.strerror}); {free_bytes(self.path)} bytes are free there"
            ) from None
        finally:
            os.close(fd)

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
