"""ExportedMemory's handle, fd serving and keeper hand-over, with memfds standing in for CUDA VMM
allocations (the CUDA calls are replaced; the fd server and keeper are the real ones), and its
fallback to CUDA_IPC when the driver refuses VMM memory (the installed cuda-bindings with its
driver calls faked)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sharing.fake_cuda import install as install_fake_bindings
from sharing.fake_cuda import ipc_bytes_for

from zerolayer.sharing import cuda_memory
from zerolayer.sharing.device_export import ExportedMemory
from zerolayer.sharing.fd_keeper import FdKeeper
from zerolayer.sharing.fd_passing import receive_fd
from zerolayer.sharing.manifest import HandleKind


class FakeAllocation:
    def __init__(self, size_bytes: int, fd: int) -> None:
        self.size_bytes = size_bytes
        self.inode = os.fstat(fd).st_ino
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def allocate_vmm(device_index: int, size_bytes: int):  # noqa: ANN202
        calls.append("allocate")
        fd = os.memfd_create("vmm")
        os.ftruncate(fd, size_bytes + 100)  # rounded up to a granularity
        return FakeAllocation(size_bytes + 100, fd), fd

    def import_vmm(fd: int, size_bytes: int, device_index: int):  # noqa: ANN202
        calls.append("import")
        return FakeAllocation(size_bytes, fd)

    monkeypatch.setattr(cuda_memory, "allocate_vmm", allocate_vmm)
    monkeypatch.setattr(cuda_memory, "import_vmm", import_vmm)
    monkeypatch.setattr(cuda_memory, "gpu_uuid", lambda index: "GPU-0000")
    return calls


def test_a_deposited_allocation_is_taken_over_by_the_next_instance(
    fake_cuda: list[str], tmp_path: Path
) -> None:
    with_keeper = {"keeper": str(tmp_path / "keep.sock"), "keeper_key": "w-1"}
    keeper = FdKeeper(with_keeper["keeper"])
    try:
        first = ExportedMemory(
            HandleKind.CUDA_VMM_FD, 0, 1000, str(tmp_path / "a.fds"), "weights", **with_keeper
        )
        assert not first.adopted and first.handle.size_bytes == 1100
        assert first.handle.gpu_uuid == "GPU-0000" and first.handle.device == "cuda:0"
        served = receive_fd(first.handle.fd_socket, first.handle.handle_id)
        assert os.fstat(served).st_ino == first.allocation.inode
        os.close(served)
        assert keeper.keys == []  # nothing kept before the owner says its contents are complete
        first.deposit({"arena_id": "abc"})
        first.deposit({"arena_id": "ignored"})  # once only
        first.close()
        assert first.allocation.closed and not os.path.exists(first.handle.fd_socket)

        second = ExportedMemory(
            HandleKind.CUDA_VMM_FD, 0, 1000, str(tmp_path / "b.fds"), "weights", **with_keeper
        )
        assert second.adopted and second.adopted_meta == {"arena_id": "abc", "size_bytes": 1100}
        assert second.allocation.inode == first.allocation.inode  # the same memory, no copy
        second.deposit({"arena_id": "new"})  # adopted: already kept
        assert fake_cuda == ["allocate", "import"]
        second.close()
    finally:
        keeper.close()


def test_a_kept_allocation_too_small_for_the_request_is_not_reused(
    fake_cuda: list[str], tmp_path: Path
) -> None:
    keeper = FdKeeper(tmp_path / "keep.sock")
    try:
        kw = {"keeper": keeper.path, "keeper_key": "k"}
        small = ExportedMemory(HandleKind.CUDA_VMM_FD, 0, 10, str(tmp_path / "a.fds"), "x", **kw)
        small.deposit({})
        small.close()
        big = ExportedMemory(HandleKind.CUDA_VMM_FD, 0, 5000, str(tmp_path / "b.fds"), "x", **kw)
        assert not big.adopted and fake_cuda == ["allocate", "allocate"]
        big.close()
    finally:
        keeper.close()


def test_without_a_keeper_nothing_is_kept_and_other_kinds_are_refused(
    fake_cuda: list[str], tmp_path: Path
) -> None:
    memory = ExportedMemory(HandleKind.CUDA_VMM_FD, 0, 64, str(tmp_path / "a.fds"), "kv-arena")
    memory.deposit({"arena_id": "x"})  # no keeper: a no-op
    assert memory.handle.handle_id.startswith("kv-arena-")
    memory.close()
    with pytest.raises(ValueError, match="not a device handle kind"):
        ExportedMemory(HandleKind.MMAP_FILE, 0, 64, str(tmp_path / "b.fds"), "x")


@pytest.mark.parametrize("refused", ["cuMemCreate", "cuMemExportToShareableHandle"])
def test_vmm_refused_by_the_driver_falls_back_to_ipc(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    refused: str,
) -> None:
    """The real cuda_vmm and cuda_ipc code over the installed cuda-bindings, whose driver refuses
    VMM memory (as some sandboxes do) while cudaMalloc and IPC handles work."""
    driver, runtime = install_fake_bindings(monkeypatch, {refused: "CUDA_ERROR_NOT_PERMITTED"})
    keeper = FdKeeper(tmp_path / "keep.sock")
    try:
        memory = ExportedMemory(
            HandleKind.CUDA_VMM_FD,
            0,
            1000,
            str(tmp_path / "w.fds"),
            "weights",
            keeper=keeper.path,
            keeper_key="w-1",
        )
        assert memory.handle.kind == HandleKind.CUDA_IPC and not memory.adopted
        assert memory.handle.ipc_handle == ipc_bytes_for(memory.allocation.ptr)
        assert (memory.handle.size_bytes, memory.handle.fd_socket) == (1000, "")
        assert not (tmp_path / "w.fds").exists()
        assert (driver.created, driver.retained) == ([], 1)  # the VMM attempt left nothing
        assert runtime.calls.count("cudaMalloc") == 1
        assert (
            f"weights: CUDA_VMM_FD refused here ({refused} failed: CUDA_ERROR_NOT_PERMITTED); "
            "falling back to CUDA_IPC" in caplog.text
        )
        memory.deposit({})  # IPC memory dies with its process: nothing to keep
        assert keeper.keys == []
        memory.close()
        assert (memory.allocation.released, driver.retained) == (True, 0)
    finally:
        keeper.close()
