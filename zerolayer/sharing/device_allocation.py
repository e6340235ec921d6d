"""One range of device memory that may be shared with other processes, and its lifetime.

A :class:`DeviceAllocation` is what :mod:`zerolayer.sharing.cuda_vmm` and
:mod:`zerolayer.sharing.cuda_ipc` return: a device pointer and size, the handle kind it came from,
and the call that frees (or unmaps) it. torch views it without copying through the CUDA Array
Interface; the memory is released only once the allocation is closed and the last view is gone.

Source: CUDA Array Interface, version 3 (Numba docs).
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections.abc import Callable, Sequence

import torch

from zerolayer.sharing.manifest import HandleKind


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
        self._freeing = False  # free() was called (once: a failed free is not retried)
        self._released = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def released(self) -> bool:
        """Whether the memory is unmapped (or freed) in this process: the free call returned. It
        stays False when that call failed (the memory is then lost to this process)."""
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
            RuntimeError: a CUDA call failed (the message names it); the free is not tried again
                (:attr:`released` stays False).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._num_tensors:
                return
        self._release()

    def _release(self) -> None:
        """Calls ``free`` once, outside the lock (it synchronizes the device); marks the memory
        released only when it returned."""
        with self._lock:
            if self._freeing:
                return
            self._freeing = True
        self._free()
        with self._lock:
            self._released = True

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
            release = self._closed and not self._num_tensors
        if release:
            self._release()

    def __del__(self) -> None:
        if not self._freeing:
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


def check_size(size_bytes: int) -> None:
    """Raises ValueError naming ``size_bytes`` unless it is positive."""
    if size_bytes <= 0:
        raise ValueError(f"size_bytes: {size_bytes} is not positive")
