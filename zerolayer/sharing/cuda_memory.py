"""Device memory that another process can map: CUDA VMM allocations and legacy CUDA IPC.

``CUDA_VMM_FD`` (:func:`allocate_vmm`, :func:`import_vmm`): physical memory made with
``cuMemCreate`` and exported as a POSIX file descriptor (``cuMemExportToShareableHandle``), which
:mod:`zerolayer.sharing.fd_passing` hands to importers; each maps it with ``cuMemAddressReserve``,
``cuMemMap`` and ``cuMemSetAccess``. The physical memory lives while any process holds a
descriptor for it or a mapping of it, so importers keep it across the exporter's exit or restart.

``CUDA_IPC`` (:func:`allocate_ipc`, :func:`import_ipc`): ``cudaMalloc`` memory and its 64-byte
``cudaIpcMemHandle_t``, opened with ``cudaIpcOpenMemHandle``. The memory dies with the exporting
process: importers' pointers dangle once it exits, so the exporter (e.g. the loader) must not be
restarted under live importers. A handle cannot be opened in the process that exported it.

Never managed (unified) memory: it cannot be exported and would migrate under the importers.

Every call runs in the device's primary context, the one torch's CUDA runtime uses, so pointers
and tensors are interchangeable with torch's; the context is made current for the call and the
thread's previous context restored after. cuda-bindings is imported on first use
(:mod:`zerolayer.sharing.cuda_driver`), so this module imports without CUDA.

The two kinds live in :mod:`zerolayer.sharing.cuda_vmm` and :mod:`zerolayer.sharing.cuda_ipc`, the
allocation object they return in :mod:`zerolayer.sharing.device_allocation`; this module is the one
entry point the layers import.

Sources: CUDA Driver API, "Virtual Memory Management" and "Interprocess Communication"; CUDA
Runtime API, "Interprocess Communication"; CUDA Array Interface, version 3 (Numba docs).
"""

from __future__ import annotations

from zerolayer.sharing.cuda_driver import device_index_for_uuid, gpu_uuid, vmm_fd_supported
from zerolayer.sharing.cuda_ipc import IPC_HANDLE_BYTES, allocate_ipc, import_ipc
from zerolayer.sharing.cuda_vmm import allocate_vmm, import_vmm
from zerolayer.sharing.device_allocation import DeviceAllocation

__all__ = [
    "IPC_HANDLE_BYTES",
    "DeviceAllocation",
    "allocate_ipc",
    "allocate_vmm",
    "device_index_for_uuid",
    "gpu_uuid",
    "import_ipc",
    "import_vmm",
    "vmm_fd_supported",
]
