"""Mapping the loader's weights and the kvstore's arena on a GPU (``--device cuda[:N]``).

The counterpart of :mod:`zerolayer.loader.device_weights` and :mod:`zerolayer.kvstore.device_arena`:
a ``DeviceMemoryHandle`` becomes a mapping in this process (``CUDA_VMM_FD``: the descriptor is
fetched over the exporter's unix socket and imported with ``cuMemImportFromShareableHandle``;
``CUDA_IPC``: ``cudaIpcOpenMemHandle``), and tensors are views of it: no copy, one set of weights
and one arena in device memory whichever process computes on them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from zerolayer.checkpoints.dtypes import torch_dtype
from zerolayer.common.device import Device
from zerolayer.common.errors import Unavailable
from zerolayer.scheduler.model.weights import mapped_files
from zerolayer.sharing import cuda_memory
from zerolayer.sharing.fd_passing import receive_fd
from zerolayer.sharing.manifest import DeviceMemoryHandle, HandleKind, WeightManifest


def import_device_memory(
    handle: DeviceMemoryHandle, device: Device
) -> cuda_memory.DeviceAllocation:
    """Maps exported device memory into this process on ``device``.

    Raises:
        ValueError: the memory is on another GPU than ``device`` (compared by UUID), or the kind
            is not a device kind.
        NotFound / Unavailable: the exporter's descriptor socket does not answer (VMM).
        RuntimeError: a CUDA call failed (the message names it).
    """
    local = cuda_memory.device_index_for_uuid(handle.gpu_uuid)
    if local != device.index:
        raise ValueError(
            f"--device: cuda:{device.index} here, but the memory is on {handle.gpu_uuid} "
            f"(cuda:{local} in this process); run both layers on the same GPU"
        )
    if handle.kind == HandleKind.CUDA_VMM_FD:
        fd = receive_fd(handle.fd_socket, handle.handle_id)
        try:
            return cuda_memory.import_vmm(fd, handle.size_bytes, device.index)
        finally:
            os.close(fd)  # the mapping keeps the memory alive
    if handle.kind == HandleKind.CUDA_IPC:
        return cuda_memory.import_ipc(handle.ipc_handle, handle.size_bytes, device.index)
    raise ValueError(f"handle kind {handle.kind.name} is not a device kind")


class DeviceWeightsView:
    """The model's tensors on ``device``: views of the loader's device memory when the manifest
    carries one, else a copy made here from the file mappings (the MMAP_FILE fallback, which
    costs a second copy of the weights on the device).

    Raises:
        ValueError / RuntimeError: see :func:`import_device_memory`.
    """

    def __init__(self, manifest: WeightManifest, device: Device) -> None:
        self.allocation: cuda_memory.DeviceAllocation | None = None
        if manifest.device_memory is not None:
            self.allocation = import_device_memory(manifest.device_memory, device)
            self.tensors = {
                t.name: self.allocation.as_tensor(
                    torch_dtype(t.dtype), t.shape, t.device_offset_bytes
                )
                for t in manifest.tensors
            }
            return
        files = mapped_files(manifest)
        target = torch.device("cuda", device.index)
        self.tensors = {
            t.name: files[t.file_index]
            .tensor(torch_dtype(t.dtype), t.shape, t.offset_bytes, t.nbytes)
            .to(target)
            for t in manifest.tensors
        }


def wait_for_layers(
    residency: Callable[[], tuple[int, int]],
    timeout_s: float = 600.0,
    poll_s: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Polls ``residency() -> (num_layers_resident, num_layers)`` until every layer is resident.

    Returns:
        The number of layers.

    Raises:
        Unavailable: not all layers resident after ``timeout_s`` seconds (the message says how
            many are).
    """
    deadline = clock() + timeout_s
    while True:
        resident, total = residency()
        if resident >= total:
            return total
        if clock() >= deadline:
            raise Unavailable(
                f"loader: {resident} of {total} layers on the device after {timeout_s} s"
            )
        sleep(poll_s)
