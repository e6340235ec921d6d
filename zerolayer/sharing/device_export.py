"""Device memory one layer exports to the others: the loader's weights, the kvstore's KV arena.

:class:`ExportedMemory` makes (or, with the launcher's fd keeper, takes back) one allocation of a
device handle kind and describes it as a :class:`DeviceMemoryHandle`:

- ``CUDA_VMM_FD``: ``cuMemCreate`` memory; its POSIX descriptor is served on ``fd_socket``
  (SCM_RIGHTS, :class:`zerolayer.sharing.fd_passing.FdServer`). With a keeper
  (:mod:`zerolayer.sharing.fd_keeper`), an allocation a previous instance deposited under the same
  key is mapped instead of a new one, and :meth:`ExportedMemory.deposit` hands a new one over
  once it holds what a successor may reuse.
- ``CUDA_IPC``: ``cudaMalloc`` memory and its ``cudaIpcMemHandle_t``; it dies with this process,
  so nothing is kept.

A device that reports VMM with POSIX descriptors may still refuse to create or export such memory
at run time (some sandboxes and VMs do); the memory is then made as ``CUDA_IPC`` instead (logged),
and :attr:`ExportedMemory.handle` says which kind it is.
"""

from __future__ import annotations

import logging
import os
import uuid

from zerolayer.sharing import cuda_memory
from zerolayer.sharing.fd_keeper import fetch_kept_fd, keep_fd
from zerolayer.sharing.fd_passing import FdServer
from zerolayer.sharing.manifest import DeviceMemoryHandle, HandleKind

log = logging.getLogger(__name__)


class ExportedMemory:
    """An exported device allocation of at least ``size_bytes`` bytes on ``cuda:device_index``.

    ``handle.kind`` is the kind made: CUDA_IPC where CUDA_VMM_FD was asked for but the driver
    refused to create or export it.

    Raises:
        ValueError: ``kind`` is not a device handle kind.
        RuntimeError: CUDA or cuda-bindings unusable, or the allocation failed.
        OSError: the descriptor socket cannot be bound.
    """

    def __init__(
        self,
        kind: HandleKind,
        device_index: int,
        size_bytes: int,
        fd_socket: str,
        name: str,
        keeper: str = "",
        keeper_key: str = "",
    ) -> None:
        """
        Args:
            kind: CUDA_VMM_FD or CUDA_IPC.
            device_index: CUDA ordinal.
            size_bytes: bytes needed (the allocation is rounded up to its granularity).
            fd_socket: unix socket path serving the VMM descriptor (unused for CUDA_IPC).
            name: what the memory holds ("weights", "kv-arena"): prefix of the served handle id
                and of log lines.
            keeper: the launcher's fd keeper socket, "" when none (VMM only).
            keeper_key: the key the memory is kept under (same content, same device).
        """
        self._name = name
        self._keeper = keeper if kind == HandleKind.CUDA_VMM_FD else ""
        self._keeper_key = keeper_key
        self._fd: int | None = None
        self._fd_server: FdServer | None = None
        self.adopted_meta: dict | None = None
        """The metadata deposited with a kept allocation this one took over (None: new)."""
        if kind == HandleKind.CUDA_VMM_FD:
            kind = self._make_vmm(device_index, size_bytes)
        if kind == HandleKind.CUDA_VMM_FD:
            handle_id = f"{name}-{uuid.uuid4().hex}"
            self._fd_server = FdServer(fd_socket)
            self._fd_server.register(handle_id, self._fd)
            if not self._keeper or self.adopted:
                self._close_fd()  # the server holds a duplicate
            extra: dict = {"fd_socket": fd_socket, "handle_id": handle_id}
        elif kind == HandleKind.CUDA_IPC:
            self.allocation, ipc_handle = cuda_memory.allocate_ipc(device_index, size_bytes)
            extra = {"ipc_handle": ipc_handle}
        else:
            raise ValueError(f"kind: {kind.name} is not a device handle kind")
        self.handle = DeviceMemoryHandle(
            kind=kind,
            device=f"cuda:{device_index}",
            gpu_uuid=cuda_memory.gpu_uuid(device_index),
            size_bytes=self.allocation.size_bytes,
            **extra,
        )

    @property
    def adopted(self) -> bool:
        """True when a previous instance's allocation was taken over (its contents kept)."""
        return self.adopted_meta is not None

    def deposit(self, meta: dict) -> None:
        """Hands a new allocation to the keeper with ``meta`` (plus its size), once; a no-op
        without a keeper or for an adopted one. Never raises: a failure is logged."""
        if self._fd is None:
            return
        try:
            keep_fd(
                self._keeper,
                self._keeper_key,
                self._fd,
                {**meta, "size_bytes": self.allocation.size_bytes},
            )
        except (OSError, ValueError) as exc:
            log.warning("could not deposit the %s with the fd keeper: %s", self._name, exc)
        finally:
            self._close_fd()

    def close(self) -> None:
        """Stops serving the descriptor and releases this process's mapping (VMM memory lives
        on in importers and the keeper; IPC memory is freed)."""
        if self._fd_server is not None:
            self._fd_server.close()
            self._fd_server = None
        self._close_fd()
        self.allocation.close()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _make_vmm(self, device_index: int, size_bytes: int) -> HandleKind:
        """Takes over the kept allocation or makes a new VMM one; returns CUDA_VMM_FD, or
        CUDA_IPC when the driver refused the VMM allocation or its export (nothing is kept)."""
        kept = self._adopt(device_index, size_bytes) if self._keeper else None
        if kept is not None:
            self.allocation, self._fd, self.adopted_meta = kept
            return HandleKind.CUDA_VMM_FD
        try:
            self.allocation, self._fd = cuda_memory.allocate_vmm(device_index, size_bytes)
        except RuntimeError as exc:
            log.warning(
                "%s: CUDA_VMM_FD refused here (%s); falling back to CUDA_IPC, whose memory dies "
                "with this process",
                self._name,
                exc,
            )
            self._keeper = ""
            return HandleKind.CUDA_IPC
        return HandleKind.CUDA_VMM_FD

    def _adopt(
        self, device_index: int, size_bytes: int
    ) -> tuple[cuda_memory.DeviceAllocation, int, dict] | None:
        """The kept allocation mapped here, with its descriptor and metadata; None if there is
        none or it cannot be used (then a new one is made)."""
        try:
            kept = fetch_kept_fd(self._keeper, self._keeper_key)
        except OSError as exc:
            log.warning("fd keeper %s unreachable (%s): new %s", self._keeper, exc, self._name)
            return None
        if kept is None:
            return None
        fd, meta = kept
        try:
            if int(meta.get("size_bytes", 0)) < size_bytes:
                raise ValueError(f"kept allocation of {meta.get('size_bytes')} < {size_bytes}")
            allocation = cuda_memory.import_vmm(fd, int(meta["size_bytes"]), device_index)
        except (ValueError, RuntimeError) as exc:
            os.close(fd)
            log.warning("cannot reuse the kept %s (%s): new allocation", self._name, exc)
            return None
        return allocation, fd, meta
