"""The CUDA driver through cuda-bindings: loading it, checking results, contexts, GPU identity.

cuda-bindings (``cuda.bindings.driver`` / ``runtime``; releases before that layout: ``cuda.cuda`` /
``cuda.cudart``) is imported on first use, so importing this module needs no CUDA. Every call
returns a ``(status, *values)`` tuple that :func:`check` unpacks.

Source: CUDA Driver API, "Device Management", "Primary Context Management", "Context Management".
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from zerolayer.common.errors import NotFound


def gpu_uuid(device_index: int) -> str:
    """UUID of ``cuda:device_index`` as nvidia-smi prints it ("GPU-" and 36 hex-and-dash chars).

    Raises:
        RuntimeError: cuda-bindings is missing or a CUDA call failed (the message names it).
    """
    driver, _ = bindings()
    check(driver.cuInit(0), "cuInit")
    device = check(driver.cuDeviceGet(device_index), "cuDeviceGet")
    get_uuid = getattr(driver, "cuDeviceGetUuid_v2", None) or driver.cuDeviceGetUuid
    raw = check(get_uuid(device), "cuDeviceGetUuid")
    return f"GPU-{uuid.UUID(bytes=as_bytes(raw.bytes))}"


def device_index_for_uuid(gpu_uuid_str: str) -> int:
    """This process's ordinal of the GPU with that UUID (ordinals differ between processes).

    Accepts the UUID with or without the "GPU-" prefix, in either case.

    Raises:
        NotFound: no visible GPU has that UUID (the message names ``gpu_uuid``).
        RuntimeError: cuda-bindings is missing or a CUDA call failed (the message names it).
    """
    driver, _ = bindings()
    check(driver.cuInit(0), "cuInit")
    wanted = gpu_uuid_str.lower().removeprefix("gpu-")
    visible = [gpu_uuid(i) for i in range(check(driver.cuDeviceGetCount(), "cuDeviceGetCount"))]
    for index, candidate in enumerate(visible):
        if candidate.lower().removeprefix("gpu-") == wanted:
            return index
    raise NotFound(f"gpu_uuid: {gpu_uuid_str!r} is not visible here (visible: {visible})")


def vmm_fd_supported(device_index: int) -> bool:
    """Whether ``cuda:device_index`` supports VMM allocations exported as POSIX descriptors.

    Both ``CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`` and
    ``CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`` must be set.

    Raises:
        RuntimeError: cuda-bindings is missing or a CUDA call failed (the message names it).
    """
    driver, _ = bindings()
    check(driver.cuInit(0), "cuInit")
    device = check(driver.cuDeviceGet(device_index), "cuDeviceGet")
    attrs = driver.CUdevice_attribute
    vmm = getattr(attrs, "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", None)
    vmm = vmm or attrs.CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED
    posix_fd = attrs.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
    return all(
        check(driver.cuDeviceGetAttribute(attr, device), "cuDeviceGetAttribute")
        for attr in (vmm, posix_fd)
    )


class PrimaryContext:
    """A retained primary context of one device: the context torch's runtime uses there."""

    def __init__(self, driver: Any, device_index: int) -> None:
        self._driver = driver
        check(driver.cuInit(0), "cuInit")
        self.device = check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        self.context = check(
            driver.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain"
        )

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """Makes the context current on this thread for the block, then restores the previous."""
        previous = check(self._driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        check(self._driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        try:
            yield
        finally:
            check(self._driver.cuCtxSetCurrent(previous), "cuCtxSetCurrent")

    def release(self) -> None:
        """Drops the retain; memory allocated in the context must be freed first."""
        check(self._driver.cuDevicePrimaryCtxRelease(self.device), "cuDevicePrimaryCtxRelease")

    def run_then_release(self, free: Callable[[], None]) -> None:
        """Runs ``free`` (which frees or unmaps this context's memory) with the context current,
        then drops the retain, also when ``free`` raised: a failed free is not retried, and the
        retain would otherwise leak (the memory itself may be lost then).

        Raises:
            RuntimeError: whatever ``free`` raised, or the release failed.
        """
        try:
            with self.current():
                free()
        finally:
            self.release()


def bindings() -> tuple[Any, Any]:
    """Returns cuda-bindings' (driver, runtime) modules, whichever layout is installed."""
    try:
        from cuda.bindings import driver, runtime
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before the cuda.bindings layout
            from cuda import cudart as runtime
        except ImportError as exc:
            raise RuntimeError(
                "CUDA memory handles need the cuda-bindings package (pip install 'zerolayer[gpu]')"
            ) from exc
    return driver, runtime


def check(result: tuple[Any, ...], call: str) -> Any:
    """Unpacks a cuda-bindings ``(status, *values)`` tuple; raises RuntimeError naming ``call``."""
    status, *values = result
    if getattr(status, "value", status) != 0:  # CUDA_SUCCESS and cudaSuccess are both 0
        raise RuntimeError(f"{call} failed: {getattr(status, 'name', status)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def as_bytes(value: Any) -> bytes:
    """A C char array from cuda-bindings as bytes (some releases give ints, possibly signed)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return bytes(b & 0xFF for b in value)
