"""The frontend's HTTP server (``--http-listen``): uvicorn serving an ASGI app as a task on the
frontend's own event loop, beside the gRPC server (not a process of its own).

The socket is bound before anything starts, so a taken port fails the frontend at once (uvicorn
would ``sys.exit``); with ``--reuse-port`` the frontends of a stack share it (SO_REUSEPORT), as
they share ``--listen``. Signals stay the layer's (``zerolayer.common.server.run_layer``):
uvicorn's own handlers are not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from dataclasses import dataclass

import uvicorn

from zerolayer.common.setting import SettingError
from zerolayer.common.settings import HTTP_LISTEN

GRACEFUL_SHUTDOWN_S = 5.0
"""How long a stopping server lets open responses (streams) finish before closing them, s."""


@dataclass(frozen=True)
class HttpServerConfig:
    """Where and how the HTTP server listens."""

    listen: str
    """``HOST:PORT`` (an IPv6 host in brackets)."""
    reuse_port: bool = False
    """Share the port with other processes (SO_REUSEPORT)."""
    tls_cert: str = ""
    """PEM certificate chain: serve HTTPS only; empty: plain HTTP."""
    tls_key: str = ""
    """PEM private key of ``tls_cert``."""


class _LayerSignalsServer(uvicorn.Server):
    """uvicorn without its signal handlers (the layer's own stop it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class HttpServer:
    """A bound socket; :meth:`start` serves an ASGI app on it, :meth:`stop` ends it."""

    def __init__(self, config: HttpServerConfig) -> None:
        """Binds the socket (nothing is served yet).

        Raises:
            SettingError: ``--http-listen`` cannot be bound (taken, or not an address here).
        """
        self._socket = bind(config.listen, config.reuse_port)
        self._config = config
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return self._socket.getsockname()[1]

    async def start(self, app: object) -> None:
        """Serves the ASGI ``app`` from now on, as a task of the running loop; returns once it
        listens.

        Raises:
            Exception: why uvicorn could not start (e.g. the TLS files do not load).
        """
        tls = {"ssl_certfile": self._config.tls_cert, "ssl_keyfile": self._config.tls_key}
        self._server = server = _LayerSignalsServer(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                **(tls if self._config.tls_cert else {}),
            )
        )
        self._task = asyncio.create_task(server.serve(sockets=[self._socket]))
        while not server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # raises why it could not start

    async def stop(self) -> None:
        """Stops accepting, lets open responses finish (at most GRACEFUL_SHUTDOWN_S), returns
        when the server is down; the socket is closed."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._socket.close()


def bind(listen: str, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to ``listen`` (``HOST:PORT``, IPv6 in brackets), not yet listening.

    Raises:
        SettingError: the address does not resolve or cannot be bound.
    """
    host, _, port = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise SettingError(HTTP_LISTEN, f"{listen}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise SettingError(HTTP_LISTEN, f"{listen}: cannot listen there ({exc.strerror})") from None
    return sock
