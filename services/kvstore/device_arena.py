"""The KV arena in exportable GPU memory (``--device cuda[:N]``), laid out as the CPU file is.

One allocation of ``layout.size_bytes`` bytes, zeroed, exported like the loader's weights
(:mod:`services.loader.device_weights`): ``CUDA_VMM_FD`` (the descriptor served on a unix socket;
the memory lives while the scheduler maps it) or ``CUDA_IPC`` (freed when the kvstore exits).

Device memory cannot be reopened by name like the shared-memory file. Under ``zerolayer up`` the
launcher's fd keeper (:mod:`services.common.fd_keeper`) holds the VMM arena's descriptor, so a
restarted kvstore reopens the same arena (same ``arena_id``, contents kept) and the scheduler
reconciles its block references exactly as on CPU. Without a keeper, or with ``CUDA_IPC`` (whose
memory dies with the kvstore), a restarted kvstore creates a new arena: the scheduler sees the id
change, ends the requests in flight with UNAVAILABLE and maps the new one.
"""

from __future__ import annotations

import logging
import os
import uuid

from services.common import cuda_memory
from services.common.fd_keeper import fetch_kept_fd, keep_fd
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
        self,
        layout: ArenaLayout,
        device_index: int,
        kind: HandleKind,
        fd_socket: str,
        keeper: str = "",
    ) -> None:
        """
        Args:
            layout: the arena's geometry.
            device_index: CUDA ordinal.
            kind: CUDA_VMM_FD or CUDA_IPC.
            fd_socket: where to serve the VMM descriptor.
            keeper: the launcher's fd keeper socket ("" when none): with CUDA_VMM_FD, an arena
                of the same layout a previous kvstore deposited there is reopened (``reopened``
                True, same ``arena_id``, contents kept), and a new one is deposited.
        """
        import torch

        if layout.num_blocks <= 0:
            raise ValueError("kv_cache_bytes: too small for a single KV block")
        self.layout = layout
        self.path = ""
        self.reopened = False
        self.arena_id = uuid.uuid4().hex
        self._fd_server: FdServer | None = None
        uuid_str = cuda_memory.gpu_uuid(device_index)
        key = f"kv-arena-{uuid_str}-{layout.num_layers}x{layout.num_blocks}x{layout.block_size}x"
        key += f"{layout.num_kv_heads}x{layout.head_dim}-{layout.dtype}"
        if kind == HandleKind.CUDA_VMM_FD:
            kept = _fetch(keeper, key) if keeper else None
            if kept is not None:
                fd, meta = kept
                self.allocation = cuda_memory.import_vmm(fd, int(meta["size_bytes"]), device_index)
                self.arena_id = str(meta["arena_id"])
                self.reopened = True
            else:
                self.allocation, fd = cuda_memory.allocate_vmm(device_index, layout.size_bytes)
            handle_id = f"kv-arena-{self.arena_id}"
            self._fd_server = FdServer(fd_socket)
            self._fd_server.register(handle_id, fd)
            if keeper and not self.reopened:
                meta = {"size_bytes": self.allocation.size_bytes, "arena_id": self.arena_id}
                try:
                    keep_fd(keeper, key, fd, meta)
                except (OSError, ValueError) as exc:
                    log.warning("could not deposit the arena with the fd keeper: %s", exc)
            os.close(fd)  # the server (and the keeper) hold duplicates
            extra: dict = {"fd_socket": fd_socket, "handle_id": handle_id}
        elif kind == HandleKind.CUDA_IPC:
            self.allocation, ipc_handle = cuda_memory.allocate_ipc(device_index, layout.size_bytes)
            extra = {"ipc_handle": ipc_handle}
        else:
            raise ValueError(f"kind: {kind.name} is not a device handle kind")
        # Zeroed like the sparse file: attention never reads unwritten slots, but padded block
        # table entries point at block 0, and garbage there could be NaN. A reopened arena keeps
        # its contents (the scheduler's cached blocks).
        if not self.reopened:
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


def _fetch(keeper: str, key: str) -> tuple[int, dict] | None:
    try:
        return fetch_kept_fd(keeper, key)
    except OSError as exc:
        log.warning("fd keeper %s unreachable (%s): new arena", keeper, exc)
        return None
