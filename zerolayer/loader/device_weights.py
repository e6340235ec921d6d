"""The loader's copy of the weights in exportable GPU memory (``--device cuda[:N]``).

One allocation holds every tensor (:func:`zerolayer.loader.device_copy.plan_placement`). It is
exported with the best kind the device supports:

- ``CUDA_VMM_FD``: ``cuMemCreate`` memory whose POSIX file descriptor this loader serves on a
  unix socket (SCM_RIGHTS). The memory lives while any process holds the descriptor or a mapping,
  so the loader may restart under a running scheduler: the scheduler keeps its mapping. Under
  ``zerolayer up`` the launcher's fd keeper also holds the descriptor, and a restarted loader maps
  that same memory instead of copying again (no second copy).
- ``CUDA_IPC``: ``cudaMalloc`` memory and its ``cudaIpcMemHandle_t``. Legacy IPC memory is freed
  when the exporting process exits, so with this kind the loader must not be restarted while a
  scheduler uses the weights (the scheduler's next kernel would read freed memory).

The copy runs on a background thread after start-up; :attr:`num_layers_resident` reports progress
(``GetResidency``), and an importer waits for the layers it needs.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence

from zerolayer.loader.device_copy import GroupCopier, Placement, plan_placement
from zerolayer.sharing import cuda_memory
from zerolayer.sharing.device_export import ExportedMemory
from zerolayer.sharing.manifest import HandleKind, WeightManifest
from zerolayer.sharing.mapped_file import MappedFile

log = logging.getLogger(__name__)


class DeviceWeights:
    """Allocates, exports and fills the device copy of a checkpoint.

    Raises:
        RuntimeError: CUDA or cuda-bindings unusable, or an allocation failed (from
            :mod:`zerolayer.sharing.cuda_memory`).
    """

    def __init__(
        self,
        manifest: WeightManifest,
        files: Sequence[MappedFile],
        num_layers: int,
        device_index: int,
        kind: HandleKind,
        fd_socket: str,
        keeper: str = "",
    ) -> None:
        """
        Args:
            manifest: the checkpoint (file-mapping form).
            files: its mapped files.
            num_layers: decoder layers (config.num_hidden_layers).
            device_index: CUDA ordinal.
            kind: CUDA_VMM_FD or CUDA_IPC (see
                :func:`zerolayer.sharing.handle_kinds.offered_kinds`);
                CUDA_IPC is used if the driver refuses CUDA_VMM_FD (``handle.kind`` says).
            fd_socket: unix socket path to serve the VMM descriptor on (unused for CUDA_IPC).
            keeper: the launcher's :class:`zerolayer.sharing.fd_keeper.FdKeeper` socket ("" when
                none). With CUDA_VMM_FD, a copy a previous loader deposited there is mapped
                instead of copying again, and a fresh copy is deposited once complete.
        """
        self.num_layers = num_layers
        self.placement: Placement = plan_placement(manifest.tensors, num_layers)
        self._manifest = manifest
        self._files = files
        self._groups_done = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        """What stopped the copy, if it failed."""
        self._memory = ExportedMemory(
            kind,
            device_index,
            self.placement.size_bytes,
            fd_socket,
            "weights",
            keeper,
            f"weights-{manifest.fingerprint}-{cuda_memory.gpu_uuid(device_index)}",
        )
        self.allocation = self._memory.allocation
        self.handle = self._memory.handle
        if self.adopted:
            log.info("weights: reusing the device copy a previous loader left (no copy)")
        log.info(
            "weights: %.1f MB of device memory on cuda:%d exported as %s",
            self.placement.size_bytes / 1e6,
            device_index,
            self.handle.kind.name,
        )

    @property
    def adopted(self) -> bool:
        """True when the weights were taken over from a previous loader (no copy made)."""
        return self._memory.adopted

    def start_copy(self) -> None:
        """Starts copying on a background thread (returns at once); with adopted weights there
        is nothing to copy and every layer is resident at once."""
        if self.adopted:
            with self._lock:
                self._groups_done = len(self.placement.groups)
            return
        self._thread = threading.Thread(target=self._copy, name="weights-copy", daemon=True)
        self._thread.start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Blocks until the copy ends; True when every layer is resident."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.num_layers_resident == self.num_layers

    @property
    def num_layers_resident(self) -> int:
        """Decoder layers whose weights are on the device, counted only once the tensors outside
        the layers (embeddings, norm, head) are too; layers complete in order."""
        with self._lock:
            return max(self._groups_done - 1, 0)

    def manifest_for(self, manifest: WeightManifest) -> WeightManifest:
        """``manifest`` with this device memory and each tensor's offset in it."""
        offsets = self.placement.offsets
        return dataclasses.replace(
            manifest,
            handle_kind=self.handle.kind,
            device_memory=self.handle,
            tensors=tuple(
                dataclasses.replace(t, device_offset_bytes=offsets[t.name])
                for t in manifest.tensors
            ),
        )

    def close(self) -> None:
        """Stops serving the descriptor and drops this process's mapping (VMM memory lives on in
        importers and the keeper; IPC memory is freed)."""
        self._memory.close()

    def _copy(self) -> None:
        import torch

        started = time.perf_counter()
        try:
            torch.cuda.set_device(self.allocation.device_index)
            target = self.allocation.as_tensor(torch.uint8, (self.placement.size_bytes,))
            copier = GroupCopier(self._files, self._manifest.tensors, self.placement, target)
            copier.run(self._group_done)
            del target
        except BaseException as exc:  # noqa: BLE001 - reported through GetResidency and the log
            self.error = exc
            log.exception("copying the weights to the device failed")
            return
        log.info(
            "weights resident on cuda:%d in %.0f ms",
            self.allocation.device_index,
            (time.perf_counter() - started) * 1e3,
        )
        self._memory.deposit({})  # complete: a restarted loader may map it instead

    def _group_done(self, group: int) -> None:
        with self._lock:
            self._groups_done = group + 1
