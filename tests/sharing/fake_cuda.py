"""A fake CUDA driver and runtime behind the installed cuda-bindings, for tests without a GPU.

The calls zerolayer makes (``cuMemCreate``, ``cudaMalloc``, ``cudaIpcGetMemHandle`` ...) are
recorded and answered here; every type, struct and enum (``CUresult``, ``CUmemAllocationProp``,
``cudaIpcMemHandle_t`` ...) is the installed package's own, so code that reads or writes those
structs runs against the real layout. A call named in ``fail`` returns that error instead.
:func:`install` puts the fake where ``zerolayer.sharing.cuda_driver.bindings`` imports it from.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import types
from typing import Any

import pytest

GRANULARITY = 2 << 20
FIRST_PTR = 0x7F10_0000_0000
"""Device addresses handed out start here."""


def ipc_bytes_for(ptr: int) -> bytes:
    """The 64 bytes the fake runtime's ``cudaIpcGetMemHandle`` gives the allocation at ``ptr``."""
    return ptr.to_bytes(8, "little") * 8


class _Fake:
    """Answers the calls it defines; anything else is the installed module's attribute."""

    def __init__(self, real: types.ModuleType, ok: Any, fail: dict[str, str]) -> None:
        self._real = real
        self._ok = ok
        self.fail = fail
        """Call name -> name of the error status that call returns."""
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _answer(self, call: str, *values: Any) -> tuple:
        self.calls.append(call)
        if call in self.fail:
            status = getattr(type(self._ok), self.fail[call])
            return (status, *([None] * len(values)))
        return (self._ok, *values)


class FakeDriver(_Fake):
    """``cuda.bindings.driver``: devices, primary contexts and the virtual memory calls."""

    def __init__(self, real: types.ModuleType, fail: dict[str, str]) -> None:
        super().__init__(real, real.CUresult.CUDA_SUCCESS, fail)
        self.retained = 0
        """Primary-context retains not yet released."""
        self.created: list[int] = []
        """Physical allocations made by cuMemCreate and not yet released."""
        self._handles = itertools.count(1)
        self._ptrs = itertools.count(FIRST_PTR, 1 << 32)
        self.sizes: dict[int, int] = {}
        """Base address -> size of every range the runtime allocated or opened."""

    def cuInit(self, flags: int) -> tuple:  # noqa: N802
        return self._answer("cuInit")

    def cuDeviceGet(self, index: int) -> tuple:  # noqa: N802
        return self._answer("cuDeviceGet", self._real.CUdevice(index))

    def cuDeviceGetUuid_v2(self, device: Any) -> tuple:  # noqa: N802
        return self._answer("cuDeviceGetUuid", types.SimpleNamespace(bytes=bytes(range(16))))

    def cuDevicePrimaryCtxRetain(self, device: Any) -> tuple:  # noqa: N802
        answer = self._answer("cuDevicePrimaryCtxRetain", self._real.CUcontext(0x1000))
        self.retained += answer[0] == self._ok
        return answer

    def cuDevicePrimaryCtxRelease(self, device: Any) -> tuple:  # noqa: N802
        self.retained -= 1
        return self._answer("cuDevicePrimaryCtxRelease")

    def cuCtxGetCurrent(self) -> tuple:  # noqa: N802
        return self._answer("cuCtxGetCurrent", self._real.CUcontext(0))

    def cuCtxSetCurrent(self, context: Any) -> tuple:  # noqa: N802
        return self._answer("cuCtxSetCurrent")

    def cuCtxSynchronize(self) -> tuple:  # noqa: N802
        return self._answer("cuCtxSynchronize")

    def cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple:  # noqa: N802
        return self._answer("cuMemGetAllocationGranularity", GRANULARITY)

    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple:  # noqa: N802
        handle = next(self._handles)
        answer = self._answer("cuMemCreate", handle)
        if answer[0] == self._ok:
            self.created.append(handle)
        return answer

    def cuMemExportToShareableHandle(self, handle: int, kind: Any, flags: int) -> tuple:  # noqa: N802
        answer = self._answer("cuMemExportToShareableHandle", None)
        if answer[0] != self._ok:
            return answer
        return (self._ok, os.memfd_create("fake-vmm"))

    def cuMemRelease(self, handle: int) -> tuple:  # noqa: N802
        self.created.remove(handle)
        return self._answer("cuMemRelease")

    def cuMemAddressReserve(self, size: int, alignment: int, addr: int, flags: int) -> tuple:  # noqa: N802
        ptr = next(self._ptrs)
        self.sizes[ptr] = size
        return self._answer("cuMemAddressReserve", ptr)

    def cuMemMap(self, ptr: int, size: int, offset: int, handle: int, flags: int) -> tuple:  # noqa: N802
        return self._answer("cuMemMap")

    def cuMemSetAccess(self, ptr: int, size: int, desc: list, count: int) -> tuple:  # noqa: N802
        return self._answer("cuMemSetAccess")

    def cuMemUnmap(self, ptr: int, size: int) -> tuple:  # noqa: N802
        return self._answer("cuMemUnmap")

    def cuMemAddressFree(self, ptr: int, size: int) -> tuple:  # noqa: N802
        return self._answer("cuMemAddressFree")

    def cuMemGetAddressRange(self, ptr: int) -> tuple:  # noqa: N802
        return self._answer("cuMemGetAddressRange", ptr, self.sizes[int(ptr)])


class FakeRuntime(_Fake):
    """``cuda.bindings.runtime``: ``cudaMalloc`` memory and legacy IPC handles."""

    def __init__(self, real: types.ModuleType, driver: FakeDriver, fail: dict[str, str]) -> None:
        super().__init__(real, real.cudaError_t.cudaSuccess, fail)
        self._driver = driver
        self.opened: list[bytes] = []
        """The bytes of every handle cudaIpcOpenMemHandle was given."""

    def cudaSetDevice(self, index: int) -> tuple:  # noqa: N802
        return self._answer("cudaSetDevice")

    def cudaMalloc(self, size: int) -> tuple:  # noqa: N802
        ptr = next(self._driver._ptrs)
        self._driver.sizes[ptr] = size
        return self._answer("cudaMalloc", ptr)

    def cudaFree(self, ptr: int) -> tuple:  # noqa: N802
        return self._answer("cudaFree")

    def cudaIpcGetMemHandle(self, ptr: int) -> tuple:  # noqa: N802
        handle = self._real.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), ipc_bytes_for(ptr), 64)
        return self._answer("cudaIpcGetMemHandle", handle)

    def cudaIpcOpenMemHandle(self, handle: Any, flags: int) -> tuple:  # noqa: N802
        data = ctypes.string_at(handle.getPtr(), 64)
        self.opened.append(data)
        ptr = int.from_bytes(data[:8], "little")  # the exporter's address: one address space
        return self._answer("cudaIpcOpenMemHandle", ptr)

    def cudaIpcCloseMemHandle(self, ptr: int) -> tuple:  # noqa: N802
        return self._answer("cudaIpcCloseMemHandle")


def install(
    monkeypatch: pytest.MonkeyPatch, fail: dict[str, str] | None = None
) -> tuple[FakeDriver, FakeRuntime]:
    """Makes ``from cuda.bindings import driver, runtime`` give the fakes (until the test ends).

    Args:
        fail: call name -> error status name it returns (e.g.
            ``{"cuMemExportToShareableHandle": "CUDA_ERROR_NOT_PERMITTED"}``).
    """
    from cuda.bindings import driver as real_driver
    from cuda.bindings import runtime as real_runtime

    fail = fail or {}
    driver = FakeDriver(real_driver, fail)
    runtime = FakeRuntime(real_runtime, driver, fail)
    package = types.ModuleType("cuda.bindings")
    package.driver, package.runtime = driver, runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda.bindings", package)
    return driver, runtime
