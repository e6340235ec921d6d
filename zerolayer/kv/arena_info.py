"""Where a kvstore's arena is and how to map it: what ``GetArena`` tells a scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.sharing.manifest import DeviceMemoryHandle, HandleKind


@dataclass(frozen=True)
class ArenaInfo:
    """One arena as one importer sees it (the handle kind is negotiated per importer)."""

    arena_id: str
    """Changes when the arena is recreated: the KV it held is gone."""
    layout: ArenaLayout
    handle_kind: HandleKind
    """How the importer maps it: MMAP_FILE (``shm_path``) or a CUDA kind (``device_memory``)."""
    device: str = "cpu"
    """Where the arena's memory is: "cpu" or "cuda:N" as the kvstore sees it."""
    shm_path: str = ""
    """The shared-memory file (MMAP_FILE; "" for a device arena)."""
    device_memory: DeviceMemoryHandle | None = None
    """The exported device memory (CUDA handle kinds)."""
