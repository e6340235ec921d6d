"""The stack's run directory (``--run-dir``): a directory private to this user, where the layers'
unix sockets live.

Whoever can write to the directory can replace a socket in it (and reach the scheduler without
the frontend's access checks), so an existing one is used only if it is exactly what
:func:`make_run_dir` would create: this user's directory, not a symlink, no permission bits for
group or others. It is never chmodded: a shared directory (``/tmp``) is refused, not taken over.

Without ``--run-dir``, ``zerolayer up`` makes a new temporary one named after its pid
(:func:`new_run_dir`) and removes it when it stops. An ``up`` killed with SIGKILL cannot: its
layers exit (they get SIGHUP when it dies) and remove their sockets, and the empty directory
stays. So each new one first removes those whose ``up`` is dead (:func:`remove_stale_run_dirs`):
the layers alone could not tell which of them leaves last, and a later ``up`` sees the dead pid in
the name. A reused pid only delays the removal.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from zerolayer.common.process import process_exists

OWNED_RUN_DIR = re.compile(r"zerolayer-(\d+)-[a-z0-9_]+")
"""Name of a temporary run directory of ``zerolayer up``: its pid, then mkdtemp's letters."""


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


def new_run_dir(parent: Path | None = None) -> Path:
    """A new private (0700) directory ``<parent>/zerolayer-<pid>-<random>`` for the stack this
    process runs, after :func:`remove_stale_run_dirs` in ``parent`` (default: the system's
    temporary directory)."""
    parent = Path(parent or tempfile.gettempdir())
    remove_stale_run_dirs(parent)
    return Path(tempfile.mkdtemp(prefix=f"zerolayer-{os.getpid()}-", dir=parent))


def remove_stale_run_dirs(parent: Path) -> list[Path]:
    """Removes the run directories in ``parent`` of ``zerolayer up`` processes that are gone:
    named by :data:`OWNED_RUN_DIR` after a pid no process has, this user's and private
    (:func:`check_run_dir`), holding nothing but sockets. Anything else is left alone.

    Returns:
        The directories removed.
    """
    removed = []
    with os.scandir(parent) as entries:
        names = [entry.name for entry in entries if OWNED_RUN_DIR.fullmatch(entry.name)]
    for name in names:
        path = parent / name
        if process_exists(int(OWNED_RUN_DIR.fullmatch(name)[1])):
            continue
        try:
            check_run_dir(path)
            inside = [os.lstat(entry) for entry in path.iterdir()]
        except (RunDirError, OSError):
            continue
        if all(stat.S_ISSOCK(info.st_mode) for info in inside):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
