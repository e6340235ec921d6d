"""Files the stack keeps in shared places (the KV arena and its sidecar, e.g. in ``/dev/shm``):
made only by this user, for this user.

Their names can be predicted (from ``--run-dir``), so another user may have put something there
first: a file open to everyone, or a symlink to a file of ours. A new file is therefore created
exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600), and an existing one is trusted only if it
is, after opening it without following a symlink (``O_NOFOLLOW``), a regular file owned by this
user with no group or other permission bits (``fstat`` of the open descriptor, so nothing can be
swapped in between the check and the use). Source: CWE-377/CWE-59; open(2) ``O_NOFOLLOW``.
"""

from __future__ import annotations

import errno
import os
import stat

PRIVATE_MODE = 0o600
"""Permissions of every file the stack creates in a shared place: read-write for this user only."""


class UntrustedFileError(ValueError):
    """A file at a path the stack uses is not one this user made for itself: a symlink, not a
    regular file, another user's, or open to other users. ``reason`` names the path and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"shm_path: {reason}")
        self.reason = reason


def create_private(path: str) -> int:
    """Creates ``path`` (mode 0600) and returns a read-write descriptor of it.

    Raises:
        UntrustedFileError: something (a file, a symlink) is there already.
        OSError: it cannot be created otherwise (no such directory, no permission).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, PRIVATE_MODE)
    except FileExistsError:
        raise UntrustedFileError(
            f"{path} appeared while it was being created (not written to: someone else made it)"
        ) from None


def open_private(path: str, flags: int = os.O_RDWR) -> int:
    """Opens the existing file ``path`` with ``flags`` without following a symlink, and returns
    its descriptor once :func:`check_private` trusts it (else it is closed again).

    Raises:
        FileNotFoundError: nothing is there.
        UntrustedFileError: what is there is not this user's private regular file.
    """
    # NOTE: O_NONBLOCK so that a FIFO put there cannot block the open; regular files ignore it.
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedFileError(f"{path} is a symbolic link (not followed)") from None
        if exc.errno == errno.EISDIR:
            raise UntrustedFileError(f"{path} is not a regular file") from None
        if exc.errno in (errno.ENXIO, errno.EACCES, errno.EPERM):  # a socket; not ours
            raise UntrustedFileError(f"{path} cannot be opened ({exc.strerror})") from None
        raise
    try:
        check_private(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd


def check_private(path: str, info: os.stat_result) -> None:
    """Checks that ``info`` (of the open file ``path``) is a regular file owned by this user with
    no group or other permission bits.

    Raises:
        UntrustedFileError: it is not.
    """
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedFileError(f"{path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise UntrustedFileError(
            f"{path} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise UntrustedFileError(
            f"{path} has mode {mode:04o}, open to other users (the stack makes its files "
            f"{PRIVATE_MODE:04o})"
        )
