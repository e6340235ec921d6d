"""Keeps file descriptors (and a little metadata) for layers that restart: the launcher's side.

A ``CUDA_VMM_FD`` allocation lives as long as any process holds its descriptor or a mapping. The
launcher (``zerolayer up``) outlives every layer it supervises, so it runs an :class:`FdKeeper`:
the loader deposits the descriptor of its weights once they are copied, the kvstore that of its
arena. A restarted loader or kvstore takes the descriptor back and maps the same memory: no
second copy of the weights, no loss of the KV cache. The memory is freed when the stack stops
(the keeper closes its descriptors) and no process maps it any more.

Protocol, one request per connection on a unix socket (mode 0600): a line ``PUT <key> <json>``
with the descriptor attached (SCM_RIGHTS), or ``GET <key>``; the answer is one line, ``OK
<json>`` (with the descriptor attached for GET) or ``NONE``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
from pathlib import Path

from zerolayer.common.server import socket_path_error

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024


class FdKeeper:
    """Holds descriptors by key for the lifetime of this object (a daemon thread serves them).

    Raises:
        OSError: the socket cannot be bound (e.g. path longer than 107 bytes, or something but
            a socket of this user is at ``path``).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._fds: dict[str, tuple[int, dict]] = {}
        self._lock = threading.Lock()
        reason = socket_path_error(self.path)  # only a stale socket of this user is replaced
        if reason:
            raise OSError(errno.EEXIST, reason)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o600)  # before listen(): no window for other users
        self._sock.listen(16)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="fd-keeper", daemon=True)
        self._thread.start()

    @property
    def keys(self) -> list[str]:
        """Keys held now."""
        with self._lock:
            return sorted(self._fds)

    def close(self) -> None:
        """Closes every held descriptor and the socket; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            fds, self._fds = self._fds, {}
        for fd, _ in fds.values():
            os.close(fd)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    conn.settimeout(5.0)
                    self._answer(conn)
                except (OSError, ValueError) as exc:
                    log.warning("fd keeper: bad request: %s", exc)

    def _answer(self, conn: socket.socket) -> None:
        message, fds, _, _ = socket.recv_fds(conn, MAX_LINE_BYTES, 1)
        verb, _, rest = message.decode().rstrip("\n").partition(" ")
        if verb == "PUT" and len(fds) == 1:
            key, _, meta = rest.partition(" ")
            with self._lock:
                old = self._fds.pop(key, None)
                self._fds[key] = (fds[0], json.loads(meta or "{}"))
            if old is not None:
                os.close(old[0])
            conn.sendall(b"OK {}\n")
            return
        for fd in fds:
            os.close(fd)
        with self._lock:
            held = self._fds.get(rest) if verb == "GET" else None
        if held is None:
            conn.sendall(b"NONE\n")
            return
        socket.send_fds(conn, [f"OK {json.dumps(held[1])}\n".encode()], [held[0]])


def keep_fd(path: str, key: str, fd: int, meta: dict) -> None:
    """Deposits a duplicate of ``fd`` (the caller keeps ``fd``) under ``key`` with ``meta``.

    Raises:
        OSError: no keeper answers on ``path``.
        ValueError: ``key`` contains a space or newline, or the keeper refused.
    """
    if not key or any(c in key for c in " \n"):
        raise ValueError(f"key: {key!r} must be non-empty without spaces or newlines")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5.0)
        conn.connect(path)
        socket.send_fds(conn, [f"PUT {key} {json.dumps(meta)}\n".encode()], [fd])
        if not conn.recv(MAX_LINE_BYTES).startswith(b"OK"):
            raise ValueError(f"fd keeper at {path} refused {key!r}")


def fetch_kept_fd(path: str, key: str) -> tuple[int, dict] | None:
    """The descriptor kept under ``key`` (the caller owns it) and its metadata; None if none.

    Raises:
        OSError: no keeper answers on ``path``.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5.0)
        conn.connect(path)
        conn.sendall(f"GET {key}\n".encode())
        message, fds, _, _ = socket.recv_fds(conn, MAX_LINE_BYTES, 1)
    if not message.startswith(b"OK") or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    return fds[0], json.loads(message[3:].decode())
