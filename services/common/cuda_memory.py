"""Device memory that another process can map: CUDA VMM allocations and legacy CUDA IPC.

``CUDA_VMM_FD`` (:func:`allocate_vmm`, :func:`import_vmm`): physical memory made with
``cuMemCreate`` and exported as a POSIX file descriptor (``cuMemExportToShareableHandle``), which
:mod:`services.common.fd_passing` hands to importers; each maps it with ``cuMemAddressReserve``,
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
(:mod:`services.common.cuda_driver`), so this module imports without CUDA.

Sources: CUDA Driver API, "Virtual Memory Management" and "Interprocess Communication"; CUDA
Runtime API, "Interprocess Communication"; CUDA Array Interface, version 3 (Numba docs).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from services.common.cuda_driver import (
    PrimaryContext,
    as_bytes,
    bindings,
    check,
    device_index_for_uuid,
    gpu_uuid,
    vmm_fd_supported,
)
from services.common.manifest import HandleKind

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

IPC_HANDLE_BYTES = 64
"""Size of a ``cudaIpcMemHandle_t``."""


class DeviceAllocation:
    """``size_bytes`` bytes of device memory at ``ptr`` on ``cuda:device_index``, in this process.

    Args:
        ptr: device address of the first byte in this process.
        size_bytes: bytes mapped at ``ptr``.
        device_index: CUDA ordinal, as this process sees it, of the device the tensors live on.
        kind: how the memory is shared (CUDA_VMM_FD or CUDA_IPC).
        owner: True in the process that created the memory, False where it was imported.
        free: unmaps or frees the memory; called once, by :meth:`close` or the last tensor.

    Lifetime: every tensor from :meth:`as_tensor` holds a reference to this object, so dropping
    it never frees memory under a live tensor. :meth:`close` unmaps (or frees) the memory in this
    process once: at once when no such tensor is alive, else when the last one is collected. The
    memory itself may outlive this process (``CUDA_VMM_FD``: while another process holds a
    descriptor or mapping); see the module docstring.
    """

    def __init__(
        self,
        ptr: int,
        size_bytes: int,
        device_index: int,
        kind: HandleKind,
        owner: bool,
        free: Callable[[], None],
    ) -> None:
        self.ptr = ptr
        self.size_bytes = size_bytes
        self.device_index = device_index
        self.kind = kind
        self.owner = owner
        self._free = free
        self._lock = threading.RLock()  # a tensor may be collected inside a locked block
        self._num_tensors = 0
        self._closed = False
        self._released = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def released(self) -> bool:
        """Whether the memory is unmapped (or freed) in this process."""
        return self._released

    def as_tensor(
        self, dtype: torch.dtype, shape: Sequence[int], offset_bytes: int = 0
    ) -> torch.Tensor:
        """A contiguous tensor on ``cuda:device_index`` viewing the bytes at ``offset_bytes``.

        No bytes are copied: the tensor's ``data_ptr()`` is ``ptr + offset_bytes`` and writes
        through it are seen by every process mapping the memory (after the writer synchronizes).

        Raises:
            ValueError: the range lies outside the allocation or ``offset_bytes`` is not a
                multiple of the dtype's item size.
            RuntimeError: the allocation is closed, or torch copied the memory.
        """
        shape = tuple(int(d) for d in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if offset_bytes < 0 or offset_bytes + nbytes > self.size_bytes:
            raise ValueError(
                f"range [{offset_bytes}, {offset_bytes + nbytes}) outside the "
                f"{self.size_bytes}-byte allocation"
            )
        if offset_bytes % dtype.itemsize:
            raise ValueError(f"offset {offset_bytes} not aligned to {dtype.itemsize} bytes")
        device = torch.device("cuda", self.device_index)
        view = self._view(offset_bytes, nbytes)
        if view is None:
            return torch.empty(shape, dtype=dtype, device=device)
        raw = torch.as_tensor(view, device=device)
        if raw.data_ptr() != self.ptr + offset_bytes:
            raise RuntimeError("torch copied the device memory instead of viewing it")
        # NOTE: built as bytes and then viewed: the array interface has no bfloat16 or fp8 typestr.
        return raw.view(dtype).view(shape)

    def close(self) -> None:
        """Unmaps (or frees) the memory in this process; idempotent.

        If tensors from :meth:`as_tensor` are alive, the memory is released when the last of them
        is collected; no new tensor can be made either way.

        Raises:
            RuntimeError: a CUDA call failed (the message names it).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._num_tensors or self._released:
                return
            self._released = True
        self._free()

    def _view(self, offset_bytes: int, nbytes: int) -> _CudaBytes | None:
        """The array-interface object a tensor is built from (None for zero bytes)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"allocation at 0x{self.ptr:x} is closed")
            if nbytes == 0:
                return None
            self._num_tensors += 1
        return _CudaBytes(self, self.ptr + offset_bytes, nbytes)

    def _tensor_released(self) -> None:
        with self._lock:
            self._num_tensors -= 1
            release = self._closed and not self._num_tensors and not self._released
            self._released = self._released or release
        if release:
            self._free()

    def __del__(self) -> None:
        if not self._released:
            with contextlib.suppress(Exception):  # interpreter shutdown may have unloaded CUDA
                self.close()


class _CudaBytes:
    """``nbytes`` bytes at ``ptr`` as a CUDA Array Interface v3 object; counts as a live tensor."""

    def __init__(self, allocation: DeviceAllocation, ptr: int, nbytes: int) -> None:
        self.allocation = allocation
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "strides": None,
            "stream": None,  # the allocating calls are synchronous: nothing to wait for
            "version": 3,
        }
        # torch holds this object until the tensor's storage dies (CUDA Array Interface import).
        weakref.finalize(self, allocation._tensor_released).atexit = False


def allocate_vmm(device_index: int, size_bytes: int) -> tuple[DeviceAllocation, int]:
    """Creates exportable device memory on ``cuda:device_index`` and maps it read/write here.

    ``cuMemCreate`` (pinned device memory, POSIX file descriptor handle type; the size rounded up
    to ``cuMemGetAllocationGranularity``), ``cuMemExportToShareableHandle``, then
    ``cuMemAddressReserve``, ``cuMemMap`` and ``cuMemSetAccess``.

    Returns:
        The allocation (``size_bytes`` rounded up: the size to export) and its descriptor. The
        caller owns the descriptor (e.g. registers it on an FdServer, then closes it); the memory
        is freed once the allocation is closed and every descriptor and importer mapping is gone.

    Raises:
        ValueError: ``size_bytes`` is not positive.
        RuntimeError: cuda-bindings is missing or a CUDA call failed (the message names it).
    """
    _check_size(size_bytes)
    driver, _ = bindings()
    context = PrimaryContext(driver, device_index)
    try:
        with context.current():
            prop = _vmm_prop(driver, device_index)
            granularity = _granularity(driver, prop)
            size = _round_up(size_bytes, granularity)
            handle = check(driver.cuMemCreate(size, prop, 0), "cuMemCreate")
            try:
                fd = int(
                    check(
                        driver.cuMemExportToShareableHandle(handle, _posix_fd_type(driver), 0),
                        "cuMemExportToShareableHandle",
                    )
                )
                try:
                    ptr = _map(driver, handle, size, granularity, device_index)
                except BaseException:
                    os.close(fd)
                    raise
            finally:
                # The mapping and the descriptor each keep the physical memory alive.
                check(driver.cuMemRelease(handle), "cuMemRelease")
    except BaseException:
        context.release()
        raise
    free = functools.partial(_unmap_vmm, driver, context, ptr, size)
    return DeviceAllocation(
        ptr, size, device_index, HandleKind.CUDA_VMM_FD, owner=True, free=free
    ), fd


def import_vmm(fd: int, size_bytes: int, device_index: int) -> DeviceAllocation:
    """Maps the VMM allocation behind ``fd`` (from :func:`allocate_vmm`) read/write here.

    ``cuMemImportFromShareableHandle``, then ``cuMemAddressReserve``, ``cuMemMap`` and
    ``cuMemSetAccess`` on ``cuda:device_index`` (this process's ordinal of the exporter's GPU:
    see :func:`device_index_for_uuid`). Does not close ``fd``: the mapping keeps the memory alive,
    so the caller may close it right after.

    Args:
        size_bytes: the exported size (``DeviceMemoryHandle.size_bytes``); rounded up to the
            allocation granularity, it must not exceed the allocation.

    Raises:
        ValueError: ``size_bytes`` is not positive.
        RuntimeError: cuda-bindings is missing or a CUDA call failed (the message names it).
    """
    _check_size(size_bytes)
    driver, _ = bindings()
    context = PrimaryContext(driver, device_index)
    try:
        with context.current():
            handle = check(
                driver.cuMemImportFromShareableHandle(fd, _posix_fd_type(driver)),
                "cuMemImportFromShareableHandle",
            )
            try:
                prop = check(
                    driver.cuMemGetAllocationPropertiesFromHandle(handle),
                    "cuMemGetAllocationPropertiesFromHandle",
                )
                granularity = _granularity(driver, prop)
                size = _round_up(size_bytes, granularity)
                ptr = _map(driver, handle, size, granularity, device_index)
            finally:
                check(driver.cuMemRelease(handle), "cuMemRelease")
    except BaseException:
        context.release()
        raise
    free = functools.partial(_unmap_vmm, driver, context, ptr, size)
    return DeviceAllocation(ptr, size, device_index, HandleKind.CUDA_VMM_FD, owner=False, free=free)


def allocate_ipc(device_index: int, size_bytes: int) -> tuple[DeviceAllocation, bytes]:
    """``cudaMalloc`` of ``size_bytes`` bytes on ``cuda:device_index`` and its IPC handle.

    The memory dies with this process, whatever importers still map it.

    Returns:
        The allocation and its 64-byte ``cudaIpcMemHandle_t`` (from ``cudaIpcGetMemHandle``).

    Raises:
        ValueError: ``size_bytes`` is not positive.
        RuntimeError: cuda-bindings is missing or a CUDA call failed (the message names it).
    """
    _check_size(size_bytes)
    driver, runtime = bindings()
    context = PrimaryContext(driver, device_index)
    try:
        with context.current():
            check(runtime.cudaSetDevice(device_index), "cudaSetDevice")
            ptr = int(check(runtime.cudaMalloc(size_bytes), "cudaMalloc"))
            try:
                handle = check(runtime.cudaIpcGetMemHandle(ptr), "cudaIpcGetMemHandle")
                handle_bytes = as_bytes(handle.reserved)
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
    _check_size(size_bytes)
    driver, runtime = bindings()
    context = PrimaryContext(driver, device_index)
    try:
        with context.current():
            check(runtime.cudaSetDevice(device_index), "cudaSetDevice")
            ipc_handle = runtime.cudaIpcMemHandle_t()
            ipc_handle.reserved = bytes(handle)
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


def _check_size(size_bytes: int) -> None:
    if size_bytes <= 0:
        raise ValueError(f"size_bytes: {size_bytes} is not positive")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _posix_fd_type(driver: Any) -> Any:
    return driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def _vmm_prop(driver: Any, device_index: int) -> Any:
    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device_index
    prop.requestedHandleTypes = _posix_fd_type(driver)
    return prop


def _granularity(driver: Any, prop: Any) -> int:
    minimum = driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    return int(
        check(driver.cuMemGetAllocationGranularity(prop, minimum), "cuMemGetAllocationGranularity")
    )


def _map(driver: Any, handle: Any, size: int, alignment: int, device_index: int) -> int:
    """Reserves ``size`` bytes of address space, maps ``handle`` there, grants read/write."""
    ptr = check(driver.cuMemAddressReserve(size, alignment, 0, 0), "cuMemAddressReserve")
    try:
        check(driver.cuMemMap(ptr, size, 0, handle, 0), "cuMemMap")
        try:
            access = driver.CUmemAccessDesc()
            access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            access.location.id = device_index
            access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            check(driver.cuMemSetAccess(ptr, size, [access], 1), "cuMemSetAccess")
        except BaseException:
            driver.cuMemUnmap(ptr, size)
            raise
    except BaseException:
        driver.cuMemAddressFree(ptr, size)
        raise
    return int(ptr)


def _unmap_vmm(driver: Any, context: PrimaryContext, ptr: int, size: int) -> None:
    with context.current():
        # Work queued by torch on this range must finish before the range disappears.
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
        check(driver.cuMemUnmap(ptr, size), "cuMemUnmap")
        check(driver.cuMemAddressFree(ptr, size), "cuMemAddressFree")
    context.release()


def _free_ipc(driver: Any, runtime: Any, context: PrimaryContext, ptr: int, call: str) -> None:
    with context.current():
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
        check(getattr(runtime, call)(ptr), call)
    context.release()
