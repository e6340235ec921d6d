"""``CUDA_IPC`` device memory: ``cudaMalloc`` memory shared by a legacy IPC handle.

:func:`allocate_ipc` returns the memory and its 64-byte ``cudaIpcMemHandle_t``;
:func:`import_ipc` opens it with ``cudaIpcOpenMemHandle``. The handle's bytes are read and written
at the struct's address (``getPtr``): cuda-bindings 12.9.11 and 13.4.1 removed its ``reserved``
member, and ``getPtr`` is what every release has. The memory dies with the exporting
process: importers' pointers dangle once it exits, so the exporter (e.g. the loader) must not be
restarted under live importers. A handle cannot be opened in the process that exported it.

Every call runs in the device's primary context (see :mod:`zerolayer.sharing.cuda_memory`).
Source: CUDA Runtime API, "Interprocess Communication".
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from zerolayer.sharing.cuda_driver import PrimaryContext, bindings, check
from zerolayer.sharing.device_allocation import DeviceAllocation, check_size
from zerolayer.sharing.manifest import HandleKind

IPC_HANDLE_BYTES = 64
"""Size of a ``cudaIpcMemHandle_t``."""


def ipc_handle_bytes(handle: Any) -> bytes:
    """The 64 bytes of a cuda-bindings ``cudaIpcMemHandle_t`` (copied from its C struct)."""
    return ctypes.string_at(int(handle.getPtr()), IPC_HANDLE_BYTES)


def ipc_handle_from_bytes(runtime: Any, handle: bytes) -> Any:
    """A new ``runtime.cudaIpcMemHandle_t`` holding ``handle`` (64 bytes from
    :func:`ipc_handle_bytes`, possibly of another process).

    Raises:
        ValueError: ``handle`` is not 64 bytes.
    """
    if len(handle) != IPC_HANDLE_BYTES:
        raise ValueError(f"ipc_handle: {len(handle)} bytes, expected {IPC_HANDLE_BYTES}")
    ipc_handle = runtime.cudaIpcMemHandle_t()
    ctypes.memmove(int(ipc_handle.getPtr()), bytes(handle), IPC_HANDLE_BYTES)
    return ipc_handle


def allocate_ipc(device_index: int, size_bytes: int) -> tuple[DeviceAllocation, bytes]:
    """``cudaMalloc`` of ``size_bytes`` bytes on ``cuda:device_index`` and its IPC handle.

    The memory dies with this process, whatever importers still map it.

    Returns:
        The allocation and its 64-byte ``cudaIpcMemHandle_t`` (from ``cudaIpcGetMemHandle``).

    Raises:
        ValueError: ``size_bytes`` is not positive.
        RuntimeError: cuda-bindings is missing or a CUDA call failed (the message names it).
    """
    check_size(size_bytes)
    driver, runtime = bindings()
    context = PrimaryContext(driver, device_index)
    try:
        with context.current():
            check(runtime.cudaSetDevice(device_index), "cudaSetDevice")
            ptr = int(check(runtime.cudaMalloc(size_bytes), "cudaMalloc"))
            try:
                handle = check(runtime.cudaIpcGetMemHandle(ptr), "cudaIpcGetMemHandle")
                handle_bytes = ipc_handle_bytes(handle)
            except BaseException:
                runtime.cudaFree(ptr)
                raise
    except BaseException:
        context.release()
        raise
    free = functools.partial(_free_ipc, driver, runtime, context, ptr, "cudaFree")
    allocation = DeviceAllocation(
        ptr, size_bytes, device_index, HandleKind.CUDA_IPC, owner=True, free=free
    )
    return allocation, handle_bytes


def import_ipc(handle: bytes, size_bytes: int, device_index: int) -> DeviceAllocation:
    """Opens another process's ``cudaIpcMemHandle_t`` on ``cuda:device_index``.

    ``cudaIpcOpenMemHandle`` with ``cudaIpcMemLazyEnablePeerAccess``; closing the allocation calls
    ``cudaIpcCloseMemHandle``. The pointer is valid only while the exporter lives.

    Raises:
        ValueError: ``handle`` is not 64 bytes, ``size_bytes`` is not positive or exceeds the
            exported allocation.
        RuntimeError: cuda-bindings is missing or a CUDA call failed (the message names it),
            e.g. the exporter has exited or this is the exporting process.
    """
    if len(handle) != IPC_HANDLE_BYTES:
        raise ValueError(f"ipc_handle: {len(handle)} bytes, expected {IPC_HANDLE_BYTES}")
    check_size(size_bytes)
    driver, runtime = bindings()
    context = PrimaryContext(driver, device_index)
    try:
        with context.current():
            check(runtime.cudaSetDevice(device_index), "cudaSetDevice")
            ipc_handle = ipc_handle_from_bytes(runtime, handle)
            flags = getattr(runtime, "cudaIpcMemLazyEnablePeerAccess", 1)
            ptr = int(
                check(runtime.cudaIpcOpenMemHandle(ipc_handle, flags), "cudaIpcOpenMemHandle")
            )
            _, exported_bytes = check(driver.cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
            if size_bytes > int(exported_bytes):
                runtime.cudaIpcCloseMemHandle(ptr)
                raise ValueError(
                    f"size_bytes: {size_bytes} exceeds the exported {int(exported_bytes)} bytes"
                )
    except BaseException:
        context.release()
        raise
    free = functools.partial(_free_ipc, driver, runtime, context, ptr, "cudaIpcCloseMemHandle")
    return DeviceAllocation(
        ptr, size_bytes, device_index, HandleKind.CUDA_IPC, owner=False, free=free
    )


def _free_ipc(driver: Any, runtime: Any, context: PrimaryContext, ptr: int, call: str) -> None:
    def free() -> None:
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
        check(getattr(runtime, call)(ptr), call)

    context.run_then_release(free)
