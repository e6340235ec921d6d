"""File descriptors handed between processes over a unix socket (SCM_RIGHTS).

A CUDA VMM allocation exported with ``cuMemExportToShareableHandle`` is a POSIX file descriptor;
the exporter serves it here under a ``handle_id`` and importers fetch their own copy. A descriptor
passed this way refers to the same open file description as the sender's, so what it refers to
(a memfd, a VMM allocation) stays alive while any process holds it, whatever happens to the sender.

Wire protocol, one request per connection: the client sends ``handle_id`` (UTF-8, at most
:data:`MAX_HANDLE_ID_BYTES` bytes) and a newline; the server answers one status byte
(:class:`FdStatus`) followed by a UTF-8 message, with exactly one descriptor attached as
SCM_RIGHTS ancillary data when the status is ``OK``, then closes the connection.

Sources: unix(7) "Ancillary messages" (SCM_RIGHTS); Python's ``socket.send_fds`` /
``socket.recv_fds``.
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import socket
import stat
import threading
from pathlib import Path
from types import TracebackType

from zerolayer.common.errors import NotFound, Unavailable

log = logging.getLogger(__name__)

MAX_HANDLE_ID_BYTES = 256
"""Longest ``handle_id`` the server reads, in bytes of UTF-8."""
MAX_REPLY_BYTES = 1024
"""Longest reply (status byte and message) the client reads, in bytes."""
SOCKET_MODE = 0o600
"""Permissions of the socket file: only the exporter's user may connect."""


class FdStatus(enum.IntEnum):
    """The status byte that starts a reply."""

    OK = 0
    NOT_FOUND = 1
    BAD_REQUEST = 2


class FdServer:
    """Serves registered file descriptors on a unix socket, from one daemon thread.

    The socket file is created with mode 0600 (before the server listens, so no other user can
    connect in between); a stale socket file at ``path`` (no server answers on it) is replaced.
    Requests are answered one at a time, each within ``io_timeout_s`` seconds.

    Raises:
        OSError: ``path`` exists and is not a socket, another server is listening on it
            (``EADDRINUSE``), or it cannot be bound (e.g. longer than 107 bytes).
    """

    def __init__(self, path: str | Path, io_timeout_s: float = 5.0) -> None:
        self.path = str(path)
        self._io_timeout_s = io_timeout_s
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        _remove_stale_socket(self.path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(self.path)
            # NOTE: chmod before listen(): until then connect() is refused, so there is no window
            # in which the umask's mode lets another user in.
            os.chmod(self.path, SOCKET_MODE)
            self._inode = os.stat(self.path).st_ino
            self._sock.listen(16)
        except BaseException:
            self._sock.close()
            raise
        self._thread = threading.Thread(
            target=self._serve, name=f"fd-server:{self.path}", daemon=True
        )
        self._thread.start()

    def register(self, handle_id: str, fd: int) -> None:
        """Serves a duplicate of ``fd`` under ``handle_id``; the caller keeps ``fd`` (may close it).

        The server owns the duplicate until :meth:`unregister` or :meth:`close`.

        Raises:
            ValueError: ``handle_id`` is empty, contains a newline, is longer than
                :data:`MAX_HANDLE_ID_BYTES`, or is already registered.
            OSError: ``fd`` is not an open descriptor.
        """
        encoded = handle_id.encode()
        if not encoded or b"\n" in encoded or len(encoded) > MAX_HANDLE_ID_BYTES:
            raise ValueError(
                f"handle_id: {handle_id!r} must be 1..{MAX_HANDLE_ID_BYTES} bytes, no newline"
            )
        dup = os.dup(fd)
        with self._lock:
            if handle_id in self._fds:
                os.close(dup)
                raise ValueError(f"handle_id: {handle_id!r} is already registered")
            self._fds[handle_id] = dup

    def unregister(self, handle_id: str) -> None:
        """Stops serving ``handle_id`` and closes the server's duplicate.

        Descriptors already handed out stay valid.

        Raises:
            NotFound: ``handle_id`` is not registered.
        """
        with self._lock:
            fd = self._fds.pop(handle_id, None)
        if fd is None:
            raise NotFound(f"handle_id: {handle_id!r} is not registered on {self.path}")
        os.close(fd)

    def close(self) -> None:
        """Stops the server, closes every registered duplicate and removes the socket file.

        Idempotent. Descriptors already handed out stay valid.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            fds, self._fds = list(self._fds.values()), {}
        try:
            # Wakes the accept() in the serving thread (Linux: it fails with EINVAL).
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=self._io_timeout_s + 1.0)
        self._sock.close()
        for fd in fds:
            os.close(fd)
        try:
            if os.stat(self.path).st_ino == self._inode:  # not a successor's socket
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> FdServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                log.exception("fd server on %s: accept failed", self.path)
                return
            with conn:
                try:
                    conn.settimeout(self._io_timeout_s)
                    self._answer(conn)
                except OSError as exc:
                    log.warning("fd server on %s: request failed: %s", self.path, exc)

    def _answer(self, conn: socket.socket) -> None:
        request = _read_line(conn, MAX_HANDLE_ID_BYTES + 1)
        if request is None:
            conn.sendall(bytes([FdStatus.BAD_REQUEST]) + b"expected handle_id and a newline")
            return
        handle_id = request.decode(errors="replace")
        with self._lock:
            registered = self._fds.get(handle_id)
            # Sends a duplicate so that a concurrent unregister() cannot close it mid-send.
            fd = os.dup(registered) if registered is not None else None
        if fd is None:
            message = f"handle_id: {handle_id!r} is not registered on {self.path}"
            conn.sendall(bytes([FdStatus.NOT_FOUND]) + message.encode())
            return
        try:
            socket.send_fds(conn, [bytes([FdStatus.OK]) + b"ok"], [fd])
        finally:
            os.close(fd)


def receive_fd(path: str | Path, handle_id: str, timeout_s: float = 5.0) -> int:
    """Fetches the descriptor an :class:`FdServer` serves under ``handle_id``.

    Returns:
        A new descriptor (close-on-exec) for the same open file as the server's; the caller owns
        it and must ``os.close`` it.

    Raises:
        NotFound: the server does not serve ``handle_id`` (the message names it).
        Unavailable: nothing answers on ``path``, the server did not answer within
            ``timeout_s`` seconds, or the reply is malformed.
    """
    path = str(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
            sock.sendall(handle_id.encode() + b"\n")
            data, fds, flags, _ = socket.recv_fds(
                sock, MAX_REPLY_BYTES, 1, getattr(socket, "MSG_CMSG_CLOEXEC", 0)
            )
        except OSError as exc:  # includes TimeoutError, FileNotFoundError, ConnectionRefused
            raise Unavailable(f"fd_socket: cannot fetch {handle_id!r} from {path}: {exc}") from exc
    if data[:1] == bytes([FdStatus.OK]) and len(fds) == 1 and not flags & socket.MSG_CTRUNC:
        # NOTE: MSG_CMSG_CLOEXEC is missing from some Python builds' socket module.
        os.set_inheritable(fds[0], False)
        return fds[0]
    for fd in fds:
        os.close(fd)
    if data[:1] == bytes([FdStatus.NOT_FOUND]):
        raise NotFound(f"handle_id: {handle_id!r} is not served on {path}")
    message = data[1:].decode(errors="replace")
    raise Unavailable(
        f"fd_socket: bad reply from {path} for {handle_id!r} "
        f"(status {data[:1].hex() or 'none'}, {len(fds)} descriptor(s)): {message}"
    )


def _read_line(conn: socket.socket, max_bytes: int) -> bytes | None:
    """Reads up to a newline; None when the peer closes first or sends more than max_bytes."""
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(max_bytes + 1 - len(buf))
        if not chunk:
            return None
        buf += chunk
        if len(buf) > max_bytes and b"\n" not in buf:
            return None
    line = buf.split(b"\n", 1)[0]
    return line or None


def _remove_stale_socket(path: str) -> None:
    """Unlinks a socket file nobody listens on; refuses a live server or a non-socket file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)
            return
    raise OSError(errno.EADDRINUSE, f"another server is listening on {path}")
