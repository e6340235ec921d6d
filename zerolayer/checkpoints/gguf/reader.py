"""One GGUF file's header, metadata and tensor infos, read with the ``gguf`` package's reader and
checked, so that a bad file is one line naming the tensor or metadata key.

Layout (ggml's ``docs/gguf.md``, version 3): magic ``GGUF``, version, tensor count and metadata
count (little-endian u32, u64, u64), the metadata key/value pairs, one info per tensor (name,
dims ``ne[0..n)`` with ``ne[0]`` the row length, ggml type, offset into the data section), padding
to ``general.alignment`` (default 32), then the data section. ``gguf.GGUFReader`` memory-maps the
file and parses the header; tensor data is never read here (the loader maps it).

NOTE: the checks hook into ``GGUFReader``'s private methods (``_get``, ``_push_field``,
``_get_tensor_info_field``, ``_build_tensors``) of the pinned gguf 0.19.0; the tests feed it each
kind of bad file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.tensor_types import BY_GGML_TYPE, SERVED_TYPES

MAGIC = b"GGUF"
MIN_FILE_BYTES = 24
"""Magic, version, tensor count and metadata count."""
MAX_DIMS = 4
"""GGML_MAX_DIMS."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor of a GGUF file lives."""

    name: str
    """Its GGUF name ("blk.0.attn_q.weight")."""
    dtype: str
    """Its GGUF type name ("F32", "Q8_0" ...; see :mod:`.tensor_types`)."""
    shape: tuple[int, ...]
    """Row-major: GGUF's dims reversed, so a matrix of rows of K weights is [N, K]."""
    offset_bytes: int
    """Absolute offset of its data in the file."""
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    """A checked GGUF file: its metadata and tensor infos (no tensor data)."""

    path: Path
    metadata: dict[str, Any]
    """Metadata key -> value (str, int, float, bool, or a list of them)."""
    tensors: tuple[TensorInfo, ...]
    alignment: int
    """``general.alignment``, bytes."""
    data_offset: int
    """Where the data section starts, bytes."""
    size_bytes: int


class _Truncated(Exception):
    """The header ends past the end of the file."""


class _CheckedReader(gguf.GGUFReader):
    """``GGUFReader`` that refuses what it would misread: a read past the end, a duplicate key,
    a tensor of an unserved type, out of the file or misaligned; records where it is."""

    last_tensor = ""
    """The name of the last tensor info read."""

    def __init__(self, path: Path) -> None:
        self.infos: list[TensorInfo] = []
        super().__init__(path, "r")

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > len(self.data):
            raise _Truncated()
        return super()._get(offset, dtype, count, override_order)

    def _push_field(self, field: Any, skip_sum: bool = False) -> int:
        if field.name in self.fields:
            raise CheckpointError(f"metadata key {field.name!r} appears twice")
        return super()._push_field(field, skip_sum)

    def _get_tensor_info_field(self, orig_offs: int) -> Any:
        field = super()._get_tensor_info_field(orig_offs)
        self.last_tensor = field.name
        return field

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        # NOTE: instead of the reader's numpy views of the data: infos only, each checked.
        names: set[str] = set()
        for field in fields:
            info = _tensor_info(field, start_offs, self.alignment, len(self.data))
            if info.name in names:
                raise CheckpointError(f"tensor {info.name!r} appears twice")
            names.add(info.name)
            self.infos.append(info)


def _tensor_info(field: Any, start: int, alignment: int, size: int) -> TensorInfo:
    """The checked info of one tensor (see :func:`read_gguf_file`)."""
    _, name_data, _, dims, raw_type, offset = field.parts
    name = bytes(name_data).decode("utf-8", errors="replace")
    served = BY_GGML_TYPE.get(int(raw_type[0]))
    if served is None:
        known = {t.value: t.name for t in gguf.GGMLQuantizationType}
        kind = known.get(int(raw_type[0]), "unknown")
        raise CheckpointError(
            f"tensor {name!r} has type {int(raw_type[0])} ({kind}), which zerolayer does not "
            f"serve (served: {', '.join(SERVED_TYPES)})"
        )
    ne = [int(d) for d in dims]
    if not 1 <= len(ne) <= MAX_DIMS or min(ne) < 1:
        raise CheckpointError(f"tensor {name!r} has dims {ne} (1 to {MAX_DIMS} positive ones)")
    if ne[0] % served.block_size:
        raise CheckpointError(
            f"tensor {name!r}: rows of {ne[0]} weights are not whole {served.name} blocks of "
            f"{served.block_size}"
        )
    relative = int(offset[0])
    if relative % alignment:
        raise CheckpointError(
            f"tensor {name!r}: data offset {relative} is not a multiple of general.alignment "
            f"({alignment})"
        )
    count = 1
    for d in ne:
        count *= d
    nbytes = count // served.block_size * served.type_size
    begin = start + relative
    if begin + nbytes > size:
        raise CheckpointError(
            f"tensor {name!r}: data ends at byte {begin + nbytes}, past the end of the file "
            f"({size} bytes): truncated"
        )
    return TensorInfo(name, served.name, tuple(reversed(ne)), begin, nbytes)


def read_gguf_file(path: Path) -> GGUFFile:
    """Reads and checks the header of the GGUF file ``path`` (no tensor data is read).

    Raises:
        CheckpointError: one line naming the file and the metadata key or tensor: not a GGUF
            file (magic), an unsupported version or a big-endian file, a header that ends past
            the end of the file (truncated), a malformed or duplicate metadata entry, a bad
            ``general.alignment``; a tensor that appears twice, has no served type, has dims
            that are not 1 to 4 positive ones or rows that are not whole blocks of its type, a
            data offset that is not a multiple of ``general.alignment``, or data past the end
            of the file (truncated).
        OSError: the file cannot be opened.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
    if size < MIN_FILE_BYTES or magic != MAGIC:
        raise CheckpointError(f"{path}: not a GGUF file (it starts {magic!r}, not {MAGIC!r})")
    reader = _CheckedReader.__new__(_CheckedReader)
    try:
        reader.__init__(path)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    except _Truncated:
        where = _where(reader)
        raise CheckpointError(
            f"{path}: {where} ends past the end of the file ({size} bytes): truncated"
        ) from None
    except (ValueError, KeyError, IndexError, OverflowError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: {_where(reader)} is malformed ({exc})") from None
    if reader.byte_order != "I":
        raise CheckpointError(f"{path}: a big-endian GGUF file (GGUF.version), not served")
    metadata = {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }
    return GGUFFile(
        path, metadata, tuple(reader.infos), int(reader.alignment), int(reader.data_offset), size
    )


def _where(reader: _CheckedReader) -> str:
    """The part of the header the reader was in when it stopped, by the last entry it read."""
    fields = getattr(reader, "fields", {})
    keys = [name for name in fields if not name.startswith("GGUF.")]
    if reader.last_tensor:
        return f"the tensor info after tensor {reader.last_tensor!r}"
    kv_count = fields.get("GGUF.kv_count")
    if kv_count is not None and len(keys) == int(kv_count.parts[0][0]):
        return "the first tensor info"
    if keys:
        return f"the metadata entry after key {keys[-1]!r}"
    return "the first metadata entry" if kv_count is not None else "the header"
