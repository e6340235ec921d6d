"""The KV arena in exportable GPU memory (``--device cuda[:N]``), laid out as the CPU file is.

One allocation of ``layout.size_bytes`` bytes, zeroed, exported like the loader's weights
(:mod:`services.loader.device_weights`): ``CUDA_VMM_FD`` (the descriptor served on a unix socket;
the memory lives while the scheduler maps it) or ``CUDA_IPC`` (freed when the kvstore exits).

Unlike the shared-memory file, device memory cannot be reopened by name: a restarted kvstore
creates a new arena (new ``arena_id``). The scheduler then sees the id change, ends the requests
in flight with UNAVAILABLE, maps the new arena and reconciles its block references as on CPU.
"""

from __future__ import annotations

import logging
import os
import uuid

from services.common import cuda_memory
from services.common.fd_passing import FdServer
from services.common.manifest import DeviceMemoryHandle, HandleKind
from services.kvstore.arena import ArenaLayout

log = logging.getLogger(__name__)


class DeviceArena:
    """Owns the arena's device memory (same attributes as :class:`services.kvstore.arena.Arena`).

    Raises:
        ValueError: the layout has no blocks, or ``kind`` is not a device kind.
        RuntimeError: CUDA or cuda-bindings unusable, or the allocation failed.
    """

    def __init__(
        self, layout: ArenaLayout, device_index: int, kind: HandleKind, fd_socket: str
    ) -> None:
        import torch

        if layout.num_blocks <= 0:
            raise ValueError("kv_cache_bytes: too small for a single KV block")
        self.layout = layout
        self.path = ""
        self.reopened = False
        self.arena_id = uuid.uuid4().hex
        self._fd_server: FdServer | None = None
        if kind == HandleKind.CUDA_VMM_FD:
            self.allocation, fd = cuda_memory.allocate_vmm(device_index, layout.size_bytes)
            handle_id = f"kv-arena-{self.arena_id}"
            self._fd_server = FdServer(fd_socket)
            self._fd_server.register(handle_id, fd)
            os.close(fd)  # the server holds a duplicate
            extra: dict = {"fd_socket": fd_socket, "handle_id": handle_id}
        elif kind == HandleKind.CUDA_IPC:
            self.allocation, ipc_handle = cuda_memory.allocate_ipc(device_index, layout.size_bytes)
            extra = {"ipc_handle": ipc_handle}
        else:
            raise ValueError(f"kind: {kind.name} is not a device handle kind")
        # Zeroed like the sparse file: attention never reads unwritten slots, but padded block
        # table entries point at block 0, and garbage there could be NaN.
        with torch.cuda.device(device_index):
            self.allocation.as_tensor(torch.uint8, (layout.size_bytes,)).zero_()
            torch.cuda.synchronize(device_index)
        self.handle = DeviceMemoryHandle(
            kind=kind,
            device=f"cuda:{device_index}",
            gpu_uuid=cuda_memory.gpu_uuid(device_index),
            size_bytes=self.allocation.size_bytes,
            **extra,
        )
        log.info(
            "arena on cuda:%d: %.1f MB exported as %s",
            device_index,
            layout.size_bytes / 1e6,
            kind.name,
        )

    @property
    def device(self) -> str:
        """ "cuda:N"."""
        return self.handle.device

    def unlink(self) -> None:
        """Stops serving the descriptor and releases this process's mapping."""
        if self._fd_server is not None:
            self._fd_server.close()
            self._fd_server = None
        self.allocation.close()
