"""Which device a layer runs on: the ``--device`` flag (``cpu``, ``cuda``, ``cuda:N``, ``auto``).

Parsing needs no CUDA; :func:`resolve_device` checks the device exists, so a layer asked for a
GPU it does not have exits at start-up with a message instead of falling back silently. ``auto``
is the one spelling that falls back: a CUDA device when torch sees one, else the CPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_SPEC = re.compile(r"^(cpu|auto|cuda)(?::(\d+))?$")


@dataclass(frozen=True)
class Device:
    """A resolved device: ``cpu`` or ``cuda`` with its ordinal."""

    kind: str
    """"cpu" or "cuda"."""
    index: int = 0
    """CUDA ordinal as this process sees it (0 for the CPU)."""

    @property
    def is_cuda(self) -> bool:
        """True for a CUDA device."""
        return self.kind == "cuda"

    def __str__(self) -> str:
        return f"cuda:{self.index}" if self.is_cuda else "cpu"


CPU = Device("cpu")
"""The default device."""


def parse_device(spec: str) -> tuple[str, int | None]:
    """Splits a ``--device`` value into (kind, ordinal or None); no CUDA needed.

    Raises:
        ValueError: not one of ``cpu``, ``auto``, ``cuda``, ``cuda:N`` (message names ``--device``).
    """
    match = _SPEC.match(spec.strip().lower())
    if match is None or (match.group(1) != "cuda" and match.group(2) is not None):
        raise ValueError(f"--device: {spec!r} is not one of cpu, auto, cuda, cuda:N")
    index = match.group(2)
    return match.group(1), int(index) if index is not None else None


def resolve_device(spec: str, cuda_device_count: Callable[[], int] | None = None) -> Device:
    """The device ``spec`` names on this machine.

    Args:
        spec: a ``--device`` value.
        cuda_device_count: how many CUDA devices torch sees (default: ``torch.cuda.device_count``
            when ``torch.cuda.is_available()``, else 0); tests pass their own.

    Raises:
        ValueError: a malformed spec, or a CUDA device that does not exist here (the message says
            how many there are).
    """
    kind, index = parse_device(spec)
    if kind == "cpu":
        return Device("cpu")
    count = (cuda_device_count or _torch_cuda_device_count)()
    if kind == "auto":
        return Device("cuda", 0) if count > 0 else Device("cpu")
    index = index or 0
    if index >= count:
        seen = f"{count} CUDA device(s)" if count else "no CUDA device (torch.cuda.is_available())"
        raise ValueError(f"--device: {spec!r} asked for, but this machine has {seen}")
    return Device("cuda", index)


def _torch_cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def fd_socket_path(address: str, layer: str, pid: int) -> str:
    """Unix socket on which a layer serves CUDA_VMM_FD descriptors (SCM_RIGHTS).

    Beside the layer's own socket for ``unix:PATH`` addresses (``PATH.fds``), else in the
    temporary directory, named after the layer and its process id.
    """
    if address.startswith("unix:"):
        return address[len("unix:") :].removeprefix("//") + ".fds"
    import tempfile

    return f"{tempfile.gettempdir()}/zerolayer-{layer}-{pid}.fds"


def device_argument(spec: str) -> str:
    """argparse ``type=``: the resolved device as a string ("cpu", "cuda:N").

    Raises:
        argparse.ArgumentTypeError: see :func:`resolve_device`.
    """
    import argparse

    try:
        return str(resolve_device(spec))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--device: ")) from None
