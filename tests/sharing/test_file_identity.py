"""Tests for the identity the loader records per weight file and the importer's check."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from zerolayer.sharing.file_identity import FileIdentity, WeightFileChanged, check_opened


def open_identity(path: Path) -> tuple[int, FileIdentity]:
    fd = os.open(path, os.O_RDONLY)
    return fd, FileIdentity.of(os.fstat(fd))


def test_the_same_file_through_another_mount_number_passes(tmp_path: Path) -> None:
    path = tmp_path / "w"
    path.write_bytes(b"x" * 10)
    fd, identity = open_identity(path)
    try:
        assert check_opened(str(path), fd, replace(identity, device_id=identity.device_id + 1))
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("inode", "another file (inode"),
        ("size_bytes", "rewritten in place (size 11 -> 10 bytes, mtime changed: False)"),
        ("mtime_ns", "rewritten in place (size 10 -> 10 bytes, mtime changed: True)"),
    ],
)
def test_another_file_or_version_is_refused(tmp_path: Path, field: str, message: str) -> None:
    path = tmp_path / "w"
    path.write_bytes(b"x" * 10)
    fd, identity = open_identity(path)
    expected = replace(identity, **{field: getattr(identity, field) + 1})
    try:
        with pytest.raises(
            WeightFileChanged, match=re.escape(str(path)) + " changed .*" + re.escape(message)
        ):
            check_opened(str(path), fd, expected)
    finally:
        os.close(fd)
