"""The stack's run directory (``--run-dir``): a directory private to this user, where the layers'
unix sockets live.

Whoever can write to the directory can replace a socket in it (and reach the scheduler without
the frontend's access checks), so an existing one is used only if it is exactly what
:func:`make_run_dir` would create: this user's directory, not a symlink, no permission bits for
group or others. It is never chmodded: a shared directory (``/tmp``) is refused, not taken over.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class RunDirError(ValueError):
    """The run directory, or a socket path in it, cannot be used; ``reason`` names the path."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def make_run_dir(path: Path) -> None:
    """Creates ``path`` with mode 0700 (its missing parents with the default mode), or checks the
    one that exists.

    Raises:
        RunDirError: it cannot be created, is a symlink or not a directory, is another user's, or
            lets group or others in (mode & 0o077).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RunDirError(f"{path}: cannot create it ({exc.strerror})") from None
    check_run_dir(path)


def check_run_dir(path: Path) -> None:
    """Checks that ``path`` is this user's private directory, without following a symlink.

    Raises:
        RunDirError: see :func:`make_run_dir`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise RunDirError(f"{path}: is a symlink; give the directory itself") from None
        if exc.errno == errno.ENOTDIR:
            raise RunDirError(f"{path}: not a directory") from None
        raise RunDirError(f"{path}: cannot open it ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if info.st_uid != os.geteuid():  # its owner could swap the sockets in it
        raise RunDirError(
            f"{path}: owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise RunDirError(
            f"{path}: mode {mode:04o} lets other users in; give a new path (created with mode "
            "0700) or a directory of mode 0700"
        )
