"""The KV arena in exportable GPU memory (``--device cuda[:N]``), laid out as the CPU file is.

One allocation of ``layout.size_bytes`` bytes, zeroed, exported like the loader's weights
(:mod:`zerolayer.loader.device_weights`): ``CUDA_VMM_FD`` (the descriptor served on a unix socket;
the memory lives while the scheduler maps it) or ``CUDA_IPC`` (freed when the kvstore exits).

Device memory cannot be reopened by name like the shared-memory file. Under ``zerolayer up`` the
launcher's fd keeper (:mod:`zerolayer.sharing.fd_keeper`) holds the VMM arena's descriptor, so a
restarted kvstore reopens the same arena (same ``arena_id``, contents kept) and the scheduler
reconciles its block references exactly as on CPU. Without a keeper, or with ``CUDA_IPC`` (whose
memory dies with the kvstore), a restarted kvstore creates a new arena: the scheduler sees the id
change, ends the requests in flight with UNAVAILABLE and maps the new one.
"""

from __future__ import annotations

import logging
import uuid

from zerolayer.kv.arena_file import ArenaSizeError
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.kvstore.owners import OwnerRecord
from zerolayer.sharing import cuda_memory
from zerolayer.sharing.device_export import ExportedMemory
from zerolayer.sharing.manifest import HandleKind

log = logging.getLogger(__name__)


class DeviceArena:
    """Owns the arena's device memory (same attributes as :class:`zerolayer.kvstore.arena.Arena`).

    Raises:
        ArenaSizeError: the layout has no blocks.
        ValueError: ``kind`` is not a device kind.
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
            kind: CUDA_VMM_FD or CUDA_IPC (CUDA_IPC if the driver refuses CUDA_VMM_FD).
            fd_socket: where to serve the VMM descriptor.
            keeper: the launcher's fd keeper socket ("" when none): with CUDA_VMM_FD, an arena
                of the same layout a previous kvstore deposited there is reopened (``reopened``
                True, same ``arena_id``, contents kept), and a new one is deposited.
        """
        import torch

        if layout.num_blocks <= 0:
            raise ArenaSizeError("too small for a single KV block")
        self.layout = layout
        self.path = ""
        key = f"kv-arena-{cuda_memory.gpu_uuid(device_index)}-{layout.num_layers}x"
        key += f"{layout.num_blocks}x{layout.block_size}x{layout.num_kv_heads}x{layout.head_dim}"
        key += f"-{layout.dtype}"
        self._memory = ExportedMemory(
            kind, device_index, layout.size_bytes, fd_socket, "kv-arena", keeper, key
        )
        self.allocation = self._memory.allocation
        self.handle = self._memory.handle
        meta = self._memory.adopted_meta
        self.reopened = meta is not None
        self.arena_id = str(meta["arena_id"]) if meta is not None else uuid.uuid4().hex
        # Zeroed like the sparse file: attention never reads unwritten slots, but padded block
        # table entries point at block 0, and garbage there could be NaN. A reopened arena keeps
        # its contents (the scheduler's cached blocks).
        if not self.reopened:
            with torch.cuda.device(device_index):
                self.allocation.as_tensor(torch.uint8, (layout.size_bytes,)).zero_()
                torch.cuda.synchronize(device_index)
        self._memory.deposit({"arena_id": self.arena_id})  # a restarted kvstore reopens it
        log.info(
            "arena on cuda:%d: %.1f MB exported as %s",
            device_index,
            layout.size_bytes / 1e6,
            self.handle.kind.name,
        )

    @property
    def device(self) -> str:
        """ "cuda:N"."""
        return self.handle.device

    def owner_records(self) -> dict[str, OwnerRecord]:
        """None: a device arena has no sidecar, so owner epochs start over with each kvstore
        process (a zombie from before a kvstore restart is then not told it is one)."""
        return {}

    def save_owner_records(self, records: dict[str, OwnerRecord]) -> None:
        """Does nothing (see :meth:`owner_records`)."""

    def unlink(self) -> None:
        """Stops serving the descriptor and releases this process's mapping."""
        self._memory.close()
