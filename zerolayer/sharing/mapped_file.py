"""A file mapped read-only with mmap(2), viewed as torch tensors without copying.

Pages of a MAP_SHARED read-only file mapping come from the kernel page cache, so every process that
maps the same file uses the same physical pages: one copy of the weights in RAM.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from zerolayer.sharing.file_identity import FileIdentity, check_opened, check_unchanged

if TYPE_CHECKING:
    import torch

PAGE_SIZE = mmap.PAGESIZE


class MappedFile:
    """A whole file mapped with ``mmap(PROT_READ, MAP_SHARED)``.

    The descriptor stays open (until :meth:`close` or collection) so that :meth:`check_unchanged`
    can ``fstat`` the mapped inode whatever is at the path now.

    Args:
        expected: the identity the loader recorded (manifest); the file opened must match it.

    Raises:
        OSError: the file cannot be opened or mapped.
        ValueError: the file is empty.
        WeightFileChanged: ``expected`` is given and another file, or another version of it, is
            at ``path`` now.
    """

    def __init__(self, path: str | Path, expected: FileIdentity | None = None) -> None:
        self.path = str(path)
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            self.identity = FileIdentity.of(st)
            if expected is not None:
                check_opened(self.path, fd, expected)
            self.size_bytes = st.st_size
            if self.size_bytes == 0:
                raise ValueError(f"{self.path}: empty file")
            self._mm = mmap.mmap(fd, self.size_bytes, prot=mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._close_fd = weakref.finalize(self, os.close, fd)
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)

    def check_unchanged(self) -> None:
        """Checks (``fstat`` of the mapped inode; touches no page) that the file still has the
        size and modification time it had when mapped. A file replaced at its path (rename)
        passes: the mapping keeps the old inode, which stays valid.

        Raises:
            WeightFileChanged: it was truncated or rewritten in place: reading the mapping past
                the new end raises SIGBUS, and the bytes before it may differ.
        """
        check_unchanged(self.path, FileIdentity.of(os.fstat(self._fd)), self.identity)

    @property
    def address(self) -> int:
        """Virtual address of the first byte of the mapping in this process."""
        return int(self._bytes.ctypes.data)

    def tensor(
        self, dtype: torch.dtype, shape: tuple[int, ...], offset: int, nbytes: int
    ) -> torch.Tensor:
        """Returns a tensor viewing ``nbytes`` bytes at ``offset``; no bytes are copied.

        The tensor is backed by read-only memory: writing to it raises SIGSEGV, so treat it as
        immutable.

        Raises:
            ValueError: the range lies outside the file, does not match dtype and shape, or is not
                aligned to the dtype's item size.
        """
        import torch

        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = int(np.prod(shape)) if shape else 1
        if offset < 0 or offset + nbytes > self.size_bytes:
            raise ValueError(f"{self.path}: range [{offset}, {offset + nbytes}) outside the file")
        if numel * itemsize != nbytes:
            raise ValueError(f"{self.path}: {nbytes} bytes do not hold {shape} of {dtype}")
        if offset % itemsize:
            raise ValueError(f"{self.path}: offset {offset} not aligned to {itemsize} bytes")
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        with warnings.catch_warnings():
            # torch warns that the buffer is not writable; we never write to weights.
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(self._mm, dtype=dtype, count=numel, offset=offset)
        return flat.view(shape)

    def residency(self) -> int:
        """Returns how many bytes of the file are resident in the page cache (mincore(2)).

        Safe on a truncated file: mincore(2) never faults (pages past the end count as absent).
        """
        num_pages = (self.size_bytes + PAGE_SIZE - 1) // PAGE_SIZE
        vec = (ctypes.c_ubyte * num_pages)()
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        rc = libc.mincore(ctypes.c_void_p(self.address), ctypes.c_size_t(self.size_bytes), vec)
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"mincore failed on {self.path}")
        resident = int(np.frombuffer(vec, dtype=np.uint8).__and__(1).sum())
        return min(resident * PAGE_SIZE, self.size_bytes)

    def prefetch(self) -> None:
        """Asks the kernel to read the file ahead (madvise(MADV_WILLNEED)); returns at once.

        Safe on a truncated file: madvise(2) never faults; read-ahead stops at the file's end.
        """
        self._mm.madvise(mmap.MADV_WILLNEED)

    def close(self) -> None:
        """Unmaps the file. Tensors made by :meth:`tensor` must no longer be used."""
        self._close_fd()
        self._bytes = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            # Tensors still reference the mapping; it is unmapped when they are collected.
            pass
