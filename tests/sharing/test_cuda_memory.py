"""Tests for cuda_memory: exportable device memory, mapped by a second process.

Without CUDA: the module imports, every CUDA function names the missing cuda-bindings, the
allocation's bookkeeping (range checks, array interface, deferred release) is exact, and against
the installed cuda-bindings' own structs with its driver calls faked (``sharing.fake_cuda``) the IPC
handle's bytes travel and every primary-context retain is released. The ``gpu`` tests move real
VMM and IPC memory between processes.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from sharing import fake_cuda

from zerolayer.common.errors import NotFound
from zerolayer.sharing import cuda_driver, cuda_memory
from zerolayer.sharing.cuda_ipc import ipc_handle_bytes, ipc_handle_from_bytes
from zerolayer.sharing.cuda_memory import DeviceAllocation
from zerolayer.sharing.fd_passing import FdServer, receive_fd
from zerolayer.sharing.manifest import HandleKind

REPO_ROOT = Path(__file__).resolve().parents[2]
NUMEL = 4096  # int32 elements a test moves between processes
FAKE_PTR = 0x7F00_0000_0000


def cuda_usable() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        cuda_driver.bindings()
    except RuntimeError:
        return False
    return True


requires_cuda = pytest.mark.skipif(not cuda_usable(), reason="needs CUDA and cuda-bindings")


def make_fake_allocation(
    size_bytes: int = 1024, error: str = ""
) -> tuple[DeviceAllocation, list[str]]:
    """An allocation whose free() is recorded instead of calling CUDA (and raises RuntimeError
    with ``error`` when that is set)."""
    calls: list[str] = []

    def free() -> None:
        calls.append("free")
        if error:
            raise RuntimeError(error)

    allocation = DeviceAllocation(
        FAKE_PTR, size_bytes, 0, HandleKind.CUDA_VMM_FD, owner=True, free=free
    )
    return allocation, calls


def pattern(scale: int, offset: int) -> torch.Tensor:
    return torch.arange(NUMEL, dtype=torch.int32) * scale + offset


def run_child(script: str, *args: object) -> str:
    """Runs ``script`` in a fresh Python process; returns its stdout (asserts it succeeded)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="zl-cuda-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- without CUDA ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: cuda_memory.allocate_vmm(0, 4096),
        lambda: cuda_memory.import_vmm(3, 4096, 0),
        lambda: cuda_memory.allocate_ipc(0, 4096),
        lambda: cuda_memory.import_ipc(bytes(64), 4096, 0),
        lambda: cuda_memory.gpu_uuid(0),
        lambda: cuda_memory.device_index_for_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        lambda: cuda_memory.vmm_fd_supported(0),
    ],
)
def test_cuda_calls_name_the_missing_bindings(
    monkeypatch: pytest.MonkeyPatch, call: Callable[[], object]
) -> None:
    for name in ("cuda", "cuda.bindings", "cuda.bindings.driver", "cuda.bindings.runtime"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(RuntimeError, match=r"need the cuda-bindings package"):
        call()


@pytest.mark.parametrize("size_bytes", [0, -1])
def test_sizes_must_be_positive(size_bytes: int) -> None:
    with pytest.raises(ValueError, match=f"size_bytes: {size_bytes} is not positive"):
        cuda_memory.allocate_vmm(0, size_bytes)
    with pytest.raises(ValueError, match=f"size_bytes: {size_bytes} is not positive"):
        cuda_memory.allocate_ipc(0, size_bytes)


def test_ipc_handle_must_be_64_bytes() -> None:
    with pytest.raises(ValueError, match="ipc_handle: 63 bytes, expected 64"):
        cuda_memory.import_ipc(bytes(63), 4096, 0)


@pytest.mark.parametrize(
    ("dtype", "shape", "offset_bytes", "message"),
    [
        (torch.float32, (257,), 0, r"range \[0, 1028\) outside the 1024-byte allocation"),
        (torch.uint8, (8,), 1020, r"range \[1020, 1028\) outside the 1024-byte allocation"),
        (torch.uint8, (1,), -1, r"range \[-1, 0\) outside the 1024-byte allocation"),
        (torch.bfloat16, (2,), 3, "offset 3 not aligned to 2 bytes"),
        (torch.float32, (4,), 6, "offset 6 not aligned to 4 bytes"),
    ],
)
def test_as_tensor_checks_the_range(
    dtype: torch.dtype, shape: tuple[int, ...], offset_bytes: int, message: str
) -> None:
    allocation, _ = make_fake_allocation()
    with pytest.raises(ValueError, match=message):
        allocation.as_tensor(dtype, shape, offset_bytes)


def test_array_interface_is_v3_bytes_at_the_offset() -> None:
    allocation, _ = make_fake_allocation()
    view = allocation._view(256, 512)
    assert view.__cuda_array_interface__ == {
        "shape": (512,),
        "typestr": "|u1",
        "data": (FAKE_PTR + 256, False),
        "strides": None,
        "stream": None,
        "version": 3,
    }
    assert allocation._view(0, 0) is None


def test_close_frees_once() -> None:
    allocation, calls = make_fake_allocation()
    assert (allocation.closed, allocation.released) == (False, False)
    allocation.close()
    allocation.close()
    assert calls == ["free"]
    assert (allocation.closed, allocation.released) == (True, True)
    with pytest.raises(RuntimeError, match="allocation at 0x7f0000000000 is closed"):
        allocation.as_tensor(torch.uint8, (4,))


def test_close_waits_for_the_last_live_view() -> None:
    allocation, calls = make_fake_allocation()
    first, second = allocation._view(0, 16), allocation._view(16, 16)
    allocation.close()
    assert (allocation.closed, allocation.released, calls) == (True, False, [])
    del first
    gc.collect()
    assert calls == []
    del second
    gc.collect()
    assert (allocation.released, calls) == (True, ["free"])


def test_views_dropped_before_close_do_not_free() -> None:
    allocation, calls = make_fake_allocation()
    view = allocation._view(0, 16)
    del view
    gc.collect()
    assert calls == []
    allocation.close()
    assert calls == ["free"]


def test_dropping_an_unclosed_allocation_frees_it() -> None:
    allocation, calls = make_fake_allocation()
    del allocation
    gc.collect()
    assert calls == ["free"]


def test_a_failed_free_leaves_the_memory_unreleased_and_is_not_retried() -> None:
    allocation, calls = make_fake_allocation(error="cuMemUnmap failed: CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(RuntimeError, match="cuMemUnmap failed"):
        allocation.close()
    assert (allocation.closed, allocation.released) == (True, False)
    allocation.close()
    del allocation
    gc.collect()
    assert calls == ["free"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_failed_free_after_the_last_view_leaves_the_memory_unreleased() -> None:
    allocation, calls = make_fake_allocation(error="cudaFree failed: cudaErrorInvalidValue")
    view = allocation._view(0, 16)
    allocation.close()
    assert calls == []
    del view  # the finalizer's exception is printed, not raised
    gc.collect()
    assert (calls, allocation.released) == (["free"], False)


# --- the installed cuda-bindings, its driver calls faked ---------------------------------------


def test_ipc_handle_bytes_round_trip_through_the_installed_cuda_bindings() -> None:
    from cuda.bindings import runtime

    data = bytes(range(7, 71))
    handle = ipc_handle_from_bytes(runtime, data)
    assert isinstance(handle, runtime.cudaIpcMemHandle_t)
    assert ipc_handle_bytes(handle) == data
    with pytest.raises(ValueError, match="ipc_handle: 65 bytes, expected 64"):
        ipc_handle_from_bytes(runtime, data + b"!")


def test_ipc_handles_carry_the_runtimes_bytes_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    driver, runtime = fake_cuda.install(monkeypatch)
    allocation, handle = cuda_memory.allocate_ipc(0, 4096)
    assert handle == fake_cuda.ipc_bytes_for(allocation.ptr)
    imported = cuda_memory.import_ipc(handle, 4096, 0)
    assert runtime.opened == [handle]
    assert (imported.ptr, imported.owner, imported.kind) == (
        allocation.ptr,
        False,
        HandleKind.CUDA_IPC,
    )
    assert driver.retained == 2
    imported.close()
    allocation.close()
    assert (imported.released, allocation.released, driver.retained) == (True, True, 0)
    assert [c for c in runtime.calls if c.startswith(("cudaFree", "cudaIpcClose"))] == [
        "cudaIpcCloseMemHandle",
        "cudaFree",
    ]


@pytest.mark.parametrize(
    ("allocate", "failing_call"),
    [
        (lambda: cuda_memory.allocate_vmm(0, 4096), "cuMemUnmap"),
        (lambda: cuda_memory.allocate_vmm(0, 4096), "cuCtxSynchronize"),
        (lambda: cuda_memory.allocate_ipc(0, 4096), "cudaFree"),
    ],
)
def test_a_failed_free_still_releases_the_primary_context(
    monkeypatch: pytest.MonkeyPatch, allocate: Callable[[], tuple], failing_call: str
) -> None:
    driver, _ = fake_cuda.install(monkeypatch)
    allocation, handle = allocate()
    if isinstance(handle, int):
        os.close(handle)  # the VMM descriptor
    assert driver.retained == 1
    status = "cudaErrorInvalidValue" if failing_call == "cudaFree" else "CUDA_ERROR_INVALID_VALUE"
    driver.fail[failing_call] = status  # one table for the driver and the runtime
    with pytest.raises(RuntimeError, match=f"{failing_call} failed: {status}"):
        allocation.close()
    assert (driver.retained, allocation.released) == (0, False)


# --- on a GPU -------------------------------------------------------------------------------

VMM_IMPORTER = """
import os, sys
import torch
from zerolayer.sharing import cuda_memory
from zerolayer.sharing.fd_passing import receive_fd

path, size_bytes, uuid, offset_bytes, numel = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(
    sys.argv[4]), int(sys.argv[5])
fd = receive_fd(path, "kv-arena")
allocation = cuda_memory.import_vmm(fd, size_bytes, cuda_memory.device_index_for_uuid(uuid))
os.close(fd)
tensor = allocation.as_tensor(torch.int32, (numel,), offset_bytes)
expected = torch.arange(numel, dtype=torch.int32) * -2 + 5
zero_copy = tensor.data_ptr() == allocation.ptr + offset_bytes
print("read", torch.equal(tensor.cpu(), expected), zero_copy)
tensor.copy_(torch.arange(numel, dtype=torch.int32, device=tensor.device) * 3 + 7)
torch.cuda.synchronize()
del tensor
allocation.close()
print("written", allocation.released)
"""

VMM_EXPORTER = """
import os, sys
import torch
from zerolayer.sharing import cuda_memory
from zerolayer.sharing.fd_passing import FdServer

numel = int(sys.argv[2])
allocation, fd = cuda_memory.allocate_vmm(0, numel * 4)
tensor = allocation.as_tensor(torch.int32, (numel,))
tensor.copy_(torch.arange(numel, dtype=torch.int32, device=tensor.device) * 5 - 11)
torch.cuda.synchronize()
server = FdServer(sys.argv[1])
server.register("weights", fd)
os.close(fd)
print("ready", allocation.size_bytes, cuda_memory.gpu_uuid(0), flush=True)
sys.stdin.readline()
os._exit(0)  # no cleanup at all, as if the loader crashed
"""

IPC_IMPORTER = """
import sys
import torch
from zerolayer.sharing import cuda_memory

handle, size_bytes, uuid, numel = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(
    sys.argv[4])
allocation = cuda_memory.import_ipc(handle, size_bytes, cuda_memory.device_index_for_uuid(uuid))
tensor = allocation.as_tensor(torch.int32, (numel,))
print("read", torch.equal(tensor.cpu(), torch.arange(numel, dtype=torch.int32) + 100))
tensor.mul_(-1)
torch.cuda.synchronize()
del tensor
allocation.close()
print("written", allocation.released, allocation.owner)
"""


def start_vmm_exporter(path: Path) -> tuple[subprocess.Popen[str], int, str]:
    """Starts VMM_EXPORTER; returns the process, the exported size and the GPU's UUID."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(VMM_EXPORTER), str(path), str(NUMEL)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    words = child.stdout.readline().split()
    assert words[:1] == ["ready"], child.stderr.read()
    return child, int(words[1]), words[2]


def stop(child: subprocess.Popen[str]) -> None:
    child.stdin.write("exit\n")
    child.stdin.close()
    child.wait(timeout=60)
    assert child.returncode == 0, child.stderr.read()


@pytest.mark.gpu
@requires_cuda
def test_vmm_round_trip_through_a_second_process(sock_dir: Path) -> None:
    offset_bytes = 8192
    allocation, fd = cuda_memory.allocate_vmm(0, 3 * 1024 * 1024 + 5)
    assert allocation.size_bytes >= 3 * 1024 * 1024 + 5
    assert (allocation.kind, allocation.owner, allocation.device_index) == (
        HandleKind.CUDA_VMM_FD,
        True,
        0,
    )
    tensor = allocation.as_tensor(torch.int32, (NUMEL,), offset_bytes)
    tensor.copy_((pattern(-2, 5)).cuda())
    torch.cuda.synchronize()
    with FdServer(sock_dir / "kv.sock") as server:
        server.register("kv-arena", fd)
        os.close(fd)
        out = run_child(
            VMM_IMPORTER,
            server.path,
            allocation.size_bytes,
            cuda_memory.gpu_uuid(0),
            offset_bytes,
            NUMEL,
        )
    assert out == "read True True\nwritten True\n"
    assert torch.equal(tensor.cpu(), pattern(3, 7))
    del tensor
    allocation.close()
    assert allocation.released


@pytest.mark.gpu
@requires_cuda
def test_vmm_mapping_outlives_the_exporter(sock_dir: Path) -> None:
    child, size_bytes, uuid = start_vmm_exporter(sock_dir / "loader.sock")
    try:
        fd = receive_fd(sock_dir / "loader.sock", "weights")
        allocation = cuda_memory.import_vmm(fd, size_bytes, cuda_memory.device_index_for_uuid(uuid))
        os.close(fd)
    finally:
        stop(child)
    tensor = allocation.as_tensor(torch.int32, (NUMEL,))
    assert torch.equal(tensor.cpu(), pattern(5, -11))
    tensor.fill_(42)
    assert torch.equal(tensor.cpu(), torch.full((NUMEL,), 42, dtype=torch.int32))
    del tensor
    allocation.close()


@pytest.mark.gpu
@requires_cuda
def test_vmm_descriptor_alone_keeps_the_memory(sock_dir: Path) -> None:
    child, size_bytes, uuid = start_vmm_exporter(sock_dir / "loader.sock")
    try:
        fd = receive_fd(sock_dir / "loader.sock", "weights")
    finally:
        stop(child)
    try:  # mapped only after the exporter is gone
        allocation = cuda_memory.import_vmm(fd, size_bytes, cuda_memory.device_index_for_uuid(uuid))
    finally:
        os.close(fd)
    tensor = allocation.as_tensor(torch.int32, (NUMEL,))
    assert torch.equal(tensor.cpu(), pattern(5, -11))
    del tensor
    allocation.close()


@pytest.mark.gpu
@requires_cuda
def test_ipc_round_trip_through_a_second_process() -> None:
    allocation, handle = cuda_memory.allocate_ipc(0, NUMEL * 4)
    assert len(handle) == 64
    assert (allocation.kind, allocation.owner, allocation.size_bytes) == (
        HandleKind.CUDA_IPC,
        True,
        NUMEL * 4,
    )
    tensor = allocation.as_tensor(torch.int32, (NUMEL,))
    tensor.copy_(pattern(1, 100).cuda())
    torch.cuda.synchronize()
    out = run_child(IPC_IMPORTER, handle.hex(), NUMEL * 4, cuda_memory.gpu_uuid(0), NUMEL)
    assert out == "read True\nwritten True False\n"
    assert torch.equal(tensor.cpu(), -pattern(1, 100))
    del tensor
    allocation.close()
    assert allocation.released


@pytest.mark.gpu
@requires_cuda
def test_as_tensor_views_without_copying() -> None:
    allocation, fd = cuda_memory.allocate_vmm(0, 4096)
    os.close(fd)
    weights = allocation.as_tensor(torch.bfloat16, (4, 8), offset_bytes=64)
    assert (weights.device, weights.dtype, weights.shape) == (
        torch.device("cuda", 0),
        torch.bfloat16,
        (4, 8),
    )
    assert weights.data_ptr() == allocation.ptr + 64
    weights.fill_(1.5)
    raw = allocation.as_tensor(torch.uint8, (64,), offset_bytes=64)
    assert torch.equal(raw.cpu(), torch.full((32,), 1.5, dtype=torch.bfloat16).view(torch.uint8))
    allocation.close()
    assert (allocation.closed, allocation.released) == (True, False)
    weights.add_(1)  # still mapped: tensors keep the memory until they are collected
    assert torch.equal(weights.cpu(), torch.full((4, 8), 2.5, dtype=torch.bfloat16))
    del weights, raw
    gc.collect()
    assert allocation.released


@pytest.mark.gpu
@requires_cuda
def test_gpu_uuid_round_trip() -> None:
    uuid = cuda_memory.gpu_uuid(0)
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid)
    assert cuda_memory.device_index_for_uuid(uuid) == 0
    assert cuda_memory.device_index_for_uuid(uuid.upper().removeprefix("GPU-")) == 0
    with pytest.raises(NotFound, match="gpu_uuid: 'GPU-00000000"):
        cuda_memory.device_index_for_uuid("GPU-00000000-0000-0000-0000-000000000000")
    assert cuda_memory.vmm_fd_supported(0) is True
