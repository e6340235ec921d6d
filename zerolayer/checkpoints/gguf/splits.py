"""Which files a GGUF checkpoint is: one ``.gguf`` file, or the parts of a split one, checked
against their ``split.*`` metadata.

llama.cpp's ``gguf-split`` names the parts ``NAME-00001-of-0000N.gguf`` (``llama_split_path``)
and writes into each ``split.no`` (u16, from 0), ``split.count`` (u16) and ``split.tensors.count``
(i32, the tensors of all parts); the first part holds every other metadata key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.metadata import Metadata

if TYPE_CHECKING:  # NOTE: the reader imports gguf and numpy; is_gguf_path runs without them
    from zerolayer.checkpoints.gguf.reader import GGUFFile

SUFFIX = ".gguf"
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
"""A part of a split GGUF file (``llama_split_path``'s ``%s-%05d-of-%05d.gguf``)."""


def is_gguf_path(path: Path) -> bool:
    """Whether ``--model path`` names a GGUF checkpoint: a ``.gguf`` file (there or not), or a
    directory with ``.gguf`` files and no config.json (a Hugging Face directory wins)."""
    if path.suffix == SUFFIX and not path.is_dir():
        return True
    return path.is_dir() and not (path / "config.json").exists() and any(path.glob(f"*{SUFFIX}"))


def gguf_paths(path: Path) -> list[Path]:
    """The files of the GGUF checkpoint at ``path``, in split order.

    Args:
        path: a ``.gguf`` file (any part of a split one names them all), or a directory holding
            one GGUF file or the parts of one split file.

    Raises:
        CheckpointError: a directory with GGUF files of several checkpoints, or a missing part.
    """
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        files = sorted(path.glob(f"*{SUFFIX}"))
        sets = {_split_set(f)[0] if SPLIT_NAME.match(f.name) else f.name for f in files}
        if len(sets) > 1:
            names = ", ".join(f.name for f in files)
            raise CheckpointError(
                f"{path}: several GGUF checkpoints ({names}); give --model the file to serve"
            )
        path = files[0]
    if not SPLIT_NAME.match(path.name):
        return [path]
    _, parts = _split_set(path)
    for part in parts:
        if not part.is_file():
            raise CheckpointError(f"{part}: missing (a part of the split GGUF file {path.name})")
    return parts


def _split_set(path: Path) -> tuple[str, list[Path]]:
    """(prefix, every part's path) of the split file ``path`` names."""
    match = SPLIT_NAME.match(path.name)
    assert match is not None
    count = int(match["count"])
    prefix = match["prefix"]
    return prefix, [
        path.with_name(f"{prefix}-{i:05d}-of-{count:05d}{SUFFIX}") for i in range(1, count + 1)
    ]


def check_splits(files: list[GGUFFile]) -> None:
    """Checks that ``files`` (from :func:`gguf_paths`, read) are the parts their ``split.*``
    metadata says, in order.

    Raises:
        CheckpointError: one line naming the file and the key: ``split.no`` out of order,
            ``split.count`` other than the number of parts, ``split.tensors.count`` differing
            between parts or from their tensors, or a single file whose ``split.count`` says it
            is one part of several.
    """
    total = sum(len(f.tensors) for f in files)
    for i, f in enumerate(files):
        meta = Metadata(f.metadata)
        count = meta.integer("split.count", 1 if len(files) == 1 else None)
        if count is None:
            raise CheckpointError(f"{f.path}: metadata key 'split.count' is missing")
        if count != len(files):
            raise CheckpointError(
                f"{f.path}: metadata key 'split.count' is {count}, but the checkpoint has "
                f"{len(files)} file(s)"
            )
        if len(files) == 1:
            continue
        number = meta.integer("split.no")
        if number != i:
            raise CheckpointError(
                f"{f.path}: metadata key 'split.no' is {number}, but it is part {i} (from 0)"
            )
        tensors = meta.integer("split.tensors.count")
        if tensors != total:
            raise CheckpointError(
                f"{f.path}: metadata key 'split.tensors.count' is {tensors}, but the parts hold "
                f"{total} tensors"
            )
