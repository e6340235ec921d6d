"""Which file a weight-file path named when the loader opened it, and whether it still does.

A path is a name, not a file: ``mv new old`` (or a Hugging Face download, which renames into place)
puts a new inode at the path while every open mapping keeps the old one; ``cp new old`` truncates
and rewrites the same inode in place, and pages of a mapping past the file's new end then raise
SIGBUS on access (mmap(2), "SIGBUS"). The loader records each file's identity in the manifest when
it opens it; an importer that opens the path later compares, so that it never views a different
file through the loader's offsets, and the loader compares its own descriptor's ``fstat`` with it
before serving, so that it reports a rewritten file instead of handing it out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from zerolayer.common.errors import FailedPrecondition

UPDATE_ADVICE = (
    "to update a model, write the new files into a new directory and restart the stack on it "
    "(or rename them into place and restart); never rewrite the files of a running stack"
)


class WeightFileChanged(FailedPrecondition):
    """A weight file is not the one the loader opened (replaced at its path, or rewritten)."""


@dataclass(frozen=True)
class FileIdentity:
    """A file's identity and version: ``stat(2)``'s st_dev, st_ino, st_size and st_mtime_ns."""

    device_id: int
    inode: int
    size_bytes: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        """The identity in a ``stat``/``fstat`` result."""
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def same_file(self, other: FileIdentity) -> bool:
        """True if both name the same inode (whatever its contents).

        NOTE: st_dev is not compared: the same file seen through two mounts of one filesystem
        (an NFS export mounted twice, two containers) may report two device numbers; a rename
        into place always changes the inode.
        """
        return self.inode == other.inode


def check_opened(path: str, fd: int, expected: FileIdentity) -> FileIdentity:
    """Checks that ``fd``, just opened at ``path``, is the file and version the loader opened.

    Returns:
        ``fd``'s identity (equal to ``expected``).

    Raises:
        WeightFileChanged: another file is at ``path`` now, or it was rewritten since (the message
            names the path and what differs).
    """
    actual = FileIdentity.of(os.fstat(fd))
    if not actual.same_file(expected):
        raise WeightFileChanged(
            f"weight file {path} changed since the loader opened it: another file (inode "
            f"{actual.inode}, was {expected.inode}) is at that path now; restart the loader to "
            f"serve it ({UPDATE_ADVICE})"
        )
    check_unchanged(path, actual, expected)
    return actual


def check_unchanged(path: str, actual: FileIdentity, expected: FileIdentity) -> None:
    """Checks that the file the loader opened still has its size and modification time.

    Raises:
        WeightFileChanged: it was truncated, extended or rewritten in place (the message names
            the path, both sizes and that its mapping can no longer be served).
    """
    if (actual.size_bytes, actual.mtime_ns) != (expected.size_bytes, expected.mtime_ns):
        raise WeightFileChanged(
            f"weight file {path} changed since the loader opened it: rewritten in place (size "
            f"{expected.size_bytes} -> {actual.size_bytes} bytes, mtime changed: "
            f"{actual.mtime_ns != expected.mtime_ns}); its mapping cannot be served "
            f"({UPDATE_ADVICE})"
        )
