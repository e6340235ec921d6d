"""Which handle kinds an exporter offers, which an importer accepts, and the one they agree on.

An exporter (the loader's weights, the kvstore's arena) offers the kinds its device can export;
the importer lists the kinds it can map, most preferred first (GetManifestRequest's
``accepted_handle_kinds``); :func:`negotiate` picks the importer's first choice that is offered.
"""

from __future__ import annotations

from collections.abc import Sequence

from zerolayer.common.errors import FailedPrecondition
from zerolayer.sharing import cuda_driver
from zerolayer.sharing.manifest import HandleKind

DEFAULT_ACCEPTED: tuple[HandleKind, ...] = (HandleKind.MMAP_FILE,)
"""What an importer that lists no kinds accepts (the proto's documented default)."""


def negotiate(accepted: Sequence[HandleKind], offered: Sequence[HandleKind]) -> HandleKind:
    """Returns the first kind of ``accepted`` (empty means MMAP_FILE) that is in ``offered``.

    The importer's order wins: it knows which kinds it maps fastest.

    Raises:
        FailedPrecondition: no accepted kind is offered; the message names the field
            ``accepted_handle_kinds`` and lists the offered kinds.
    """
    for kind in accepted or DEFAULT_ACCEPTED:
        if kind in offered:
            return HandleKind(kind)
    names = ", ".join(HandleKind(k).name for k in offered) or "nothing"
    raise FailedPrecondition(f"accepted_handle_kinds: none is offered (offered: {names})")


def offered_kinds(device: str) -> tuple[HandleKind, ...]:
    """Kinds an exporter whose memory lives on ``device`` ("cpu", "cuda" or "cuda:N") can offer.

    "cpu": ``(MMAP_FILE,)``. "cuda:N": ``(CUDA_VMM_FD, CUDA_IPC)`` when the device supports virtual
    memory management with POSIX file descriptor handles, else ``(CUDA_IPC,)``.

    Raises:
        ValueError: ``device`` is neither "cpu" nor "cuda[:N]".
        RuntimeError: a CUDA device without cuda-bindings or a working CUDA driver.
    """
    index = _cuda_index(device)
    if index is None:
        return (HandleKind.MMAP_FILE,)
    return _cuda_kinds(index)


def importer_kinds(device: str) -> tuple[HandleKind, ...]:
    """Kinds a process computing on ``device`` can map, most preferred first.

    "cpu": ``(MMAP_FILE,)``. "cuda:N": the device kinds of :func:`offered_kinds`, then MMAP_FILE
    as the last resort (the importer maps the file and copies it to its device), so an importer
    on a GPU still works with an exporter on the CPU.

    Raises:
        ValueError: ``device`` is neither "cpu" nor "cuda[:N]".
        RuntimeError: a CUDA device without cuda-bindings or a working CUDA driver.
    """
    index = _cuda_index(device)
    if index is None:
        return (HandleKind.MMAP_FILE,)
    return (*_cuda_kinds(index), HandleKind.MMAP_FILE)


def _cuda_index(device: str) -> int | None:
    """N for "cuda:N" (0 for "cuda"), None for "cpu"; ValueError for anything else."""
    if device == "cpu":
        return None
    kind, _, index = device.partition(":")
    if kind == "cuda" and (index.isdigit() or device == "cuda"):
        return int(index or 0)
    raise ValueError(f"device: {device!r} is not one of cpu, cuda, cuda:N")


def _cuda_kinds(device_index: int) -> tuple[HandleKind, ...]:

    if cuda_driver.vmm_fd_supported(device_index):
        return (HandleKind.CUDA_VMM_FD, HandleKind.CUDA_IPC)
    return (HandleKind.CUDA_IPC,)
