"""The KV arena's shared-memory file: where its layout is recorded, whether it fits, mapping it.

The kvstore creates the file (:class:`zerolayer.kvstore.arena.Arena`); a scheduler maps it with
:func:`map_arena`; ``zerolayer up`` checks before start-up that it fits (:func:`check_arena_fits`)
and removes it and its sidecar when the stack stops.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from zerolayer.checkpoints.dtypes import torch_dtype
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.kv.private_file import open_private

if TYPE_CHECKING:
    import torch


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


def map_arena(path: str, layout: ArenaLayout) -> torch.Tensor:
    """Maps an arena file read-write and shared; returns it as a tensor of ``layout.shape``.

    Writes through the tensor land in the shared file (MAP_SHARED), visible to every process
    mapping it. Only this user's private regular file is mapped, never a symlink's target.

    Raises:
        FileNotFoundError: no such file.
        UntrustedFileError: the file is not this user's private regular file.
        ValueError: the file's size does not match the layout.
    """
    fd = open_private(path)
    try:
        size = os.fstat(fd).st_size
        if size != layout.size_bytes:
            raise ValueError(f"{path}: {size} bytes, layout needs {layout.size_bytes}")
        numel = layout.size_bytes // layout.itemsize
        import torch

        # NOTE: through the checked descriptor, so a file swapped in at the path is not mapped.
        flat = torch.from_file(
            f"/proc/self/fd/{fd}", shared=True, size=numel, dtype=torch_dtype(layout.dtype)
        )
    finally:
        os.close(fd)
    return flat.view(layout.shape)
