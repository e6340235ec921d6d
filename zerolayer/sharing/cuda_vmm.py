"""``CUDA_VMM_FD`` device memory: CUDA virtual memory API allocations shared as file descriptors.

:func:`allocate_vmm` creates physical memory with ``cuMemCreate`` and exports it as a POSIX file
descriptor (``cuMemExportToShareableHandle``), which :mod:`zerolayer.sharing.fd_passing` hands to
importers; :func:`import_vmm` maps it with ``cuMemAddressReserve``, ``cuMemMap`` and
``cuMemSetAccess``. The physical memory lives while any process holds a descriptor for it or a
mapping of it, so importers keep it across the exporter's exit or restart.

Every call runs in the device's primary context (see :mod:`zerolayer.sharing.cuda_memory`).
Source: CUDA Driver API, "Virtual Memory Management".
"""

from __future__ import annotations

import functools
import os
from typing import Any

from zerolayer.sharing.cuda_driver import PrimaryContext, bindings, check
from zerolayer.sharing.device_allocation import DeviceAllocation, check_size
from zerolayer.sharing.manifest import HandleKind


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
    check_size(size_bytes)
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
    check_size(size_bytes)
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
    def unmap() -> None:
        # Work queued by torch on this range must finish before the range disappears.
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
        check(driver.cuMemUnmap(ptr, size), "cuMemUnmap")
        check(driver.cuMemAddressFree(ptr, size), "cuMemAddressFree")

    context.run_then_release(unmap)
