"""Copying a checkpoint from its file mappings into one device buffer, layer by layer.

Placement: every tensor gets an offset (aligned to 256 bytes, what cudaMalloc guarantees) in one
contiguous buffer, grouped in copy order: group 0 holds the tensors outside the decoder layers
(embeddings, final norm, LM head), group ``i + 1`` decoder layer ``i``. A group's tensors are
adjacent, so each group is one contiguous byte range.

Copy: two pinned host staging buffers alternate. The CPU packs a chunk of a group's bytes from the
page cache into one buffer while the DMA engine moves the other to the device on a side stream
(``non_blocking`` copies from pinned memory are asynchronous; CUDA C Programming Guide,
"Asynchronous Concurrent Execution"). When a group's last chunk has landed (a CUDA event), the
group is reported done, so an importer may start on early layers while later ones still copy.
On a CPU target (tests) the same code copies synchronously.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from zerolayer.sharing.manifest import TensorSpec
from zerolayer.sharing.mapped_file import MappedFile

ALIGNMENT = 256
"""Bytes; every tensor's device offset is a multiple (cudaMalloc's alignment)."""
DEFAULT_STAGING_BYTES = 64 << 20

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """Decoder layer index of a Llama tensor name ("model.layers.3.mlp..." -> 3), else None."""
    match = _LAYER.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Placement:
    """Where each tensor goes in the device buffer, and in which order groups are copied."""

    offsets: dict[str, int]
    """Tensor name -> byte offset in the buffer."""
    size_bytes: int
    """Bytes the buffer needs (end of the last tensor, aligned)."""
    groups: tuple[tuple[str, ...], ...]
    """Copy order: group 0 = tensors outside the layers, group i + 1 = layer i."""


def plan_placement(tensors: Sequence[TensorSpec], num_layers: int) -> Placement:
    """Lays the tensors out group by group, each at an ALIGNMENT-aligned offset.

    Raises:
        ValueError: a tensor names a layer >= ``num_layers``.
    """
    groups: list[list[TensorSpec]] = [[] for _ in range(num_layers + 1)]
    for spec in tensors:
        layer = layer_of(spec.name)
        if layer is not None and layer >= num_layers:
            raise ValueError(f"{spec.name}: layer {layer} but the config has {num_layers}")
        groups[0 if layer is None else layer + 1].append(spec)
    offsets: dict[str, int] = {}
    end = 0
    for group in groups:
        for spec in group:
            offsets[spec.name] = end
            end = _align(end + spec.nbytes)
    return Placement(
        offsets=offsets,
        size_bytes=max(end, ALIGNMENT),
        groups=tuple(tuple(s.name for s in g) for g in groups),
    )


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


class GroupCopier:
    """Copies placed tensors from file mappings into ``target`` through two staging buffers."""

    def __init__(
        self,
        files: Sequence[MappedFile],
        tensors: Sequence[TensorSpec],
        placement: Placement,
        target: torch.Tensor,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
    ) -> None:
        """
        Args:
            files: the mapped weight files (index = ``TensorSpec.file_index``).
            tensors: the checkpoint's tensors.
            placement: from :func:`plan_placement`.
            target: uint8 [>= placement.size_bytes] on a CUDA device (or the CPU, for tests).
            staging_bytes: size of each of the two staging buffers (pinned when ``target`` is
                on CUDA).

        Raises:
            ValueError: ``target`` is not a large enough uint8 tensor.
        """
        if target.dtype != torch.uint8 or target.numel() < placement.size_bytes:
            raise ValueError(f"target: uint8 of >= {placement.size_bytes} bytes expected")
        self._files = files
        self._specs = {t.name: t for t in tensors}
        self._placement = placement
        self._target = target
        self._cuda = target.is_cuda
        chunk = max(ALIGNMENT, min(staging_bytes, placement.size_bytes))
        self._staging = [torch.empty(chunk, dtype=torch.uint8, pin_memory=self._cuda) for _ in "ab"]
        self._stream = torch.cuda.Stream(target.device) if self._cuda else None
        self._events: list[object | None] = [None, None]
        self._slot = 0

    def run(self, on_group_done: Callable[[int], None]) -> None:
        """Copies every group in order; calls ``on_group_done(g)`` once group ``g`` is on the
        device (in order, from this thread). Returns when all copies completed.

        Raises:
            WeightFileChanged: a file was truncated or rewritten in place (checked with ``fstat``
                before each group, so that the copy stops instead of reading lost pages: a
                truncation during one group's copy can still raise SIGBUS).
        """
        pending: list[tuple[int, object]] = []
        for g, names in enumerate(self._placement.groups):
            for f in self._files:
                f.check_unchanged()
            self._copy_group(names)
            if not self._cuda:
                on_group_done(g)
                continue
            event = torch.cuda.Event()
            event.record(self._stream)
            pending.append((g, event))
            while pending and pending[0][1].query():
                on_group_done(pending.pop(0)[0])
        for g, event in pending:
            event.synchronize()
            on_group_done(g)

    def _copy_group(self, names: Sequence[str]) -> None:
        chunk_start: int | None = None
        used = 0
        capacity = self._staging[0].numel()
        for name in names:
            spec = self._specs[name]
            if spec.nbytes == 0:
                continue
            src = self._files[spec.file_index].tensor(
                torch.uint8, (spec.nbytes,), spec.offset_bytes, spec.nbytes
            )
            dst = self._placement.offsets[name]
            pos = 0
            while pos < spec.nbytes:
                if chunk_start is None:
                    chunk_start, used = dst + pos, 0
                    self._acquire()
                start_in_chunk = dst + pos - chunk_start
                room = capacity - start_in_chunk
                if room <= 0:
                    self._flush(chunk_start, used)
                    chunk_start = None
                    continue
                n = min(room, spec.nbytes - pos)
                buf = self._staging[self._slot]
                buf[start_in_chunk : start_in_chunk + n].copy_(src[pos : pos + n])
                used = start_in_chunk + n
                pos += n
        if chunk_start is not None:
            self._flush(chunk_start, used)

    def _acquire(self) -> None:
        """Waits until the current staging buffer's previous DMA finished."""
        event = self._events[self._slot]
        if event is not None:
            event.synchronize()  # type: ignore[attr-defined]
            self._events[self._slot] = None

    def _flush(self, chunk_start: int, used: int) -> None:
        buf = self._staging[self._slot][:used]
        dst = self._target[chunk_start : chunk_start + used]
        if self._cuda:
            with torch.cuda.stream(self._stream):
                dst.copy_(buf, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._stream)
            self._events[self._slot] = event
        else:
            dst.copy_(buf)
        self._slot ^= 1
