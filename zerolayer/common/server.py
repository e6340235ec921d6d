"""The one server bootstrap every layer uses: aio gRPC server, health, reflection, error mapping,
graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from zerolayer.common.health_watch import HealthServicer
from zerolayer.common.malformed_requests import MalformedRequestInterceptor
from zerolayer.common.status import ErrorMappingInterceptor
from zerolayer.common.tracing import Tracing, TracingServerInterceptor

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest gRPC message accepted or sent (manifests carry tokenizer.json: can be tens of MB)."""

CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Layers restart independently: reconnect within a second, not gRPC's default of up to 2 min.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

FAST_RECONNECT_CHANNEL_OPTIONS = (
    *(option for option in CHANNEL_OPTIONS if option[0] != "grpc.max_reconnect_backoff_ms"),
    ("grpc.max_reconnect_backoff_ms", 100),
)
""":data:`CHANNEL_OPTIONS` with reconnect attempts at most 100 ms apart, for a channel that waits
on a process still starting (the launcher's health polls, the frontend's schedulers): with up to
1 s between attempts, one that starts listening after a few seconds is seen up to a second late,
on the path to the first token. A failed attempt on a unix socket costs microseconds."""

MIN_CLIENT_PING_INTERVAL_MS = 500
"""Shortest interval between a client's HTTP/2 keepalive pings that the servers accept, ms."""

SERVER_KEEPALIVE_OPTIONS = (
    # NOTE: gRPC's defaults accept a ping at most every 5 min while calls are open and none at all
    # on an idle connection, and answer the third early ping with GOAWAY "too_many_pings": a
    # client that pings every 1 s (a common setting for long streams) was cut after a few
    # seconds of waiting behind other requests. Pings every MIN_CLIENT_PING_INTERVAL_MS or
    # slower are accepted, with or without calls in flight; faster ones still earn strikes.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
    ("grpc.http2.max_ping_strikes", 2),
)
"""The keepalive policy every layer's server enforces on its clients (docs/api.md, "Keepalive")."""


@dataclass(frozen=True)
class ServiceBinding:
    """One servicer to register: ``add(servicer, server)`` and its full service name."""

    add: Callable[[Any, grpc.aio.Server], None]
    servicer: Any
    service_name: str


class BindError(RuntimeError):
    """A server cannot listen on its address; the message names the address and why."""


def prepare_unix_socket(address: str) -> None:
    """Removes a stale socket behind a ``unix:`` address so that bind succeeds: only a socket
    of this user (a stopped process's), never a file of another kind or another user's.

    Args:
        address: gRPC address; only ``unix:PATH`` addresses are touched.

    Raises:
        BindError: something else sits at the path (:func:`socket_path_error`).
    """
    path = _unix_socket_path(address)
    if not path:
        return
    reason = socket_path_error(path)
    if reason:
        raise BindError(f"cannot listen on {address} ({reason})")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def socket_path_error(path: str) -> str:
    """Why a unix socket cannot be bound at ``path`` after removing what is there ("" when
    nothing, or a socket of this user, is there; a symlink is not followed)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ""
    if not stat.S_ISSOCK(info.st_mode):
        return f"{path} is there and is not a socket: remove it yourself"
    if info.st_uid != os.geteuid():
        return f"{path} is a socket of uid {info.st_uid}, not of this user"
    return ""


def _unix_socket_path(address: str) -> str:
    """The socket file behind a ``unix:`` address ("" for any other address)."""
    if not address.startswith("unix:"):
        return ""
    return address.removeprefix("unix:").removeprefix("//")


def _bind_failure(address: str) -> str:
    if _unix_socket_path(address):
        return "no socket file there: is its directory missing or not writable?"
    return "in use, or not a local address"


def reflection_pool(service_names: Sequence[str]) -> descriptor_pool.DescriptorPool:
    """A descriptor pool of the files that define ``service_names`` and of their dependencies,
    and nothing else: what this server's reflection describes. The process's default pool also
    holds every other proto it imports (the frontend's: the scheduler's and the loader's, its
    clients), which a caller of the public port must not be shown.

    Raises:
        KeyError: a service name the default pool does not know.
    """
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: descriptor.FileDescriptor) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        pool.Add(proto)
        added.add(file.name)

    for name in service_names:
        add(descriptor_pool.Default().FindServiceByName(name).file)
    return pool


def instance_health_name(instance_id: str) -> str:
    """The health service name under which a layer started with ``instance_id`` reports."""
    return f"zerolayer.instance.{instance_id}"


class LayerServer:
    """An aio gRPC server with health and reflection; health starts NOT_SERVING.

    Call :meth:`start`, do the layer's start-up work, then :meth:`set_serving`.
    """

    def __init__(
        self,
        address: str,
        bindings: Sequence[ServiceBinding],
        max_receive_bytes: int = MAX_MESSAGE_BYTES,
        tracing: Tracing | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        instance_id: str = "",
        reuse_port: bool = False,
        held_services: Sequence[str] = (),
        starts_traces: bool = False,
        credentials: grpc.ServerCredentials | None = None,
        private_address: str = "",
    ) -> None:
        """
        Args:
            address: ``HOST:PORT`` or ``unix:PATH``.
            bindings: the services to serve.
            max_receive_bytes: largest request message accepted (RESOURCE_EXHAUSTED above).
            tracing: opens a SERVER span per call and is flushed on stop; None: no tracing.
            starts_traces: a call that carries no trace context starts a trace (the public
                frontend); False: only calls of a caller's trace are traced (see
                :class:`TracingServerInterceptor`).
            interceptors: more interceptors, run inside error mapping (they see domain errors) and
                outside the refusal of requests that do not parse (they see it as an abort).
            instance_id: also report health under ``zerolayer.instance.<id>``, so a launcher can
                tell its own process from another one answering on the same address.
            reuse_port: share ``address`` with the other processes of the same stack
                (SO_REUSEPORT: the kernel spreads new connections over them), and also listen
                on ``private_address``, so that a launcher reaches this process alone.
                Off: a taken port is an error, so a second stack cannot share it by mistake.
            held_services: service names that report NOT_SERVING even while the server
                serves, until :meth:`release_service` (a standby scheduler's service).
            credentials: serve ``address`` with TLS (``grpc.ssl_server_credentials``); None:
                plaintext. With a ``private_address``, that is listened on too, but it serves
                ``grpc.health.v1`` alone, in plaintext: the launcher's probes need no
                certificate, and nothing else is reachable without TLS.
            private_address: ``unix:PATH`` where this process alone is reached (with
                ``reuse_port`` or ``credentials``), a socket in a directory no other user can
                write to (``zerolayer up``'s run directory): an abstract unix socket would have
                no permissions, so any local user could take its name first.

        Raises:
            ValueError: ``reuse_port`` without a ``private_address``, or a ``private_address``
                that is not ``unix:PATH``.
        """
        if reuse_port and not private_address:
            raise ValueError("reuse_port: needs a private_address")
        if private_address and not _unix_socket_path(private_address):
            raise ValueError(f"private_address: {private_address}: not unix:PATH")
        self.private_address = private_address
        self.instance_id = instance_id
        self.reuse_port = reuse_port
        self.credentials = credentials
        self._private: grpc.aio.Server | None = None
        """The health-only plaintext server on ``private_address`` (with TLS)."""
        self._held_services = set(held_services)
        self._outages: dict[str, str] = {}
        self._serving = False
        self.address = address
        self._bindings = list(bindings)
        self.tracing = tracing
        chain: list[grpc.aio.ServerInterceptor] = [
            ErrorMappingInterceptor(),
            *interceptors,
            MalformedRequestInterceptor(),
        ]
        if tracing is not None:
            chain.insert(0, TracingServerInterceptor(tracing, starts_traces))
        # NOTE: SO_REUSEPORT off unless asked for, so a second stack on a taken port fails
        # instead of silently sharing it.
        self.server = grpc.aio.server(
            interceptors=chain,
            # NOTE: gRPC takes the first of duplicate options, so the receive limit replaces
            # CHANNEL_OPTIONS' instead of following it.
            options=(
                *(o for o in CHANNEL_OPTIONS if o[0] != "grpc.max_receive_message_length"),
                *SERVER_KEEPALIVE_OPTIONS,
                ("grpc.so_reuseport", int(reuse_port)),
                ("grpc.max_receive_message_length", max_receive_bytes),
            ),
        )
        self.health = HealthServicer()
        self.not_serving_reason = ""
        """Set by :meth:`stop_serving`: why the process, alive, must get no work."""

    async def start(self) -> None:
        """Binds and starts the server. Raises BindError if the address cannot be bound."""
        for binding in self._bindings:
            binding.add(binding.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [
            *(b.service_name for b in self._bindings),
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]
        reflection.enable_server_reflection(names, self.server, pool=reflection_pool(names))
        self._listen(self.server, self.address, self.credentials)
        if self.credentials is not None and self.private_address:
            await self._start_private_health()
        elif self.reuse_port:
            self._listen(self.server, self.private_address, None)
        await self.server.start()
        socket_path = _unix_socket_path(self.address)
        if socket_path and not os.path.exists(socket_path):
            await self.server.stop(0)
            raise BindError(f"cannot listen on {self.address} ({_bind_failure(self.address)})")
        await self.set_serving(False)
        log.info("listening on %s", self.address)

    async def _start_private_health(self) -> None:
        """Serves this server's health alone, in plaintext, on ``private_address``."""
        self._private = grpc.aio.server(options=SERVER_KEEPALIVE_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._private)
        self._listen(self._private, self.private_address, None)
        await self._private.start()

    @staticmethod
    def _listen(
        server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None
    ) -> None:
        """Adds ``address`` to ``server`` (TLS with ``credentials``), a stale socket of this user
        there removed first.

        Raises:
            BindError: it cannot be bound (one line naming it and why, no gRPC traceback).
        """
        prepare_unix_socket(address)
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
        except RuntimeError:  # gRPC's "Failed to bind to address ..."
            port = 0
        if port == 0:
            raise BindError(f"cannot listen on {address} ({_bind_failure(address)})")

    async def set_serving(self, serving: bool) -> None:
        """Sets overall health and that of each registered service (NOT_SERVING for good after
        :meth:`stop_serving`; a held service stays NOT_SERVING until released)."""
        self._serving = serving
        names = ["", *(b.service_name for b in self._bindings)]
        if self.instance_id:
            names.append(instance_health_name(self.instance_id))
        for name in names:
            await self.health.set(name, self._status(name))

    def is_serving(self, name: str = "") -> bool:
        """Whether the health of ``name`` ("" is the server's) reports SERVING now; for the
        layers' serving gauges (read from any thread)."""
        return self._status(name) == health_pb2.HealthCheckResponse.SERVING

    def _status(self, name: str) -> int:
        serving = (
            self._serving
            and not self.not_serving_reason
            and name not in self._held_services
            and name not in self._outages
        )
        return (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )

    async def release_service(self, name: str) -> None:
        """Lets the held service ``name`` report what the server reports (SERVING once it
        serves); does nothing for a service that is not held."""
        if name in self._held_services:
            self._held_services.discard(name)
            await self.health.set(name, self._status(name))

    async def set_outage(self, name: str, reason: str) -> None:
        """Reports the service ``name`` NOT_SERVING while ``reason`` is not empty (something it
        needs is down, e.g. a scheduler's kvstore), and what the server reports again once it
        is empty. "" and the other names are left alone: the process itself is fine."""
        if reason:
            self._outages[name] = reason
        else:
            self._outages.pop(name, None)
        await self.health.set(name, self._status(name))

    def outage(self, name: str) -> str:
        """The reason of the outage :meth:`set_outage` set on ``name``; "" when none."""
        return self._outages.get(name, "")

    async def stop_serving(self, reason: str) -> None:
        """Reports NOT_SERVING from now on, though the process keeps running (e.g. its GPU failed:
        it answers, refuses work, and tells why through its own API).

        Args:
            reason: why; kept in :attr:`not_serving_reason`.
        """
        self.not_serving_reason = reason
        await self.set_serving(False)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stops accepting calls and waits up to ``grace_s`` seconds for calls in flight (health
        Watch streams end at once, after NOT_SERVING)."""
        await self.set_serving(False)
        self.health.end_watches()
        await self.server.stop(grace_s)
        if self._private is not None:
            await self._private.stop(0)
        if self.tracing is not None:
            self.tracing.shutdown()


async def wait_for_shutdown_signal() -> signal.Signals:
    """Returns the first of SIGTERM, SIGINT, SIGHUP or :data:`FINAL_STOP` the process receives.

    SIGHUP is what a layer gets when its launcher dies (see :func:`exit_with_launcher`).
    """
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()
    for sig in LAYER_STOP_SIGNALS:
        loop.add_signal_handler(sig, lambda s=sig: received.done() or received.set_result(s))
    return await received


async def run_layer(
    server: LayerServer,
    on_start: Callable[[], Awaitable[None]] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> signal.Signals:
    """Starts ``server``, runs ``on_start``, reports SERVING, and serves until SIGTERM, SIGINT,
    SIGHUP or :data:`FINAL_STOP`; returns the signal that stopped it. An error of ``on_start``
    stops the server, then propagates."""
    await server.start()
    if on_start is not None:
        try:
            await on_start()
        except BaseException:
            # NOTE: stopped here, not by the garbage collector once the loop is closed.
            await server.stop()
            raise
    await server.set_serving(True)
    log.info("serving")
    received = await wait_for_shutdown_signal()
    log.info("shutting down (%s)", received.name)
    await server.stop()
    if on_stop is not None:
        await on_stop()
    return received


FINAL_STOP = signal.SIGUSR1
"""A stop for good: what ``zerolayer up`` sends its layers when the stack ends (the kvstore then
releases its arena instead of keeping it for a restart). Its default action, before a layer's
handler is installed, ends the process quietly, as SIGTERM's does (SIGINT's would raise
KeyboardInterrupt in whatever is running)."""
LAYER_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, FINAL_STOP)

LAUNCHER_PID_ENV = "ZEROLAYER_LAUNCHER_PID"
"""Set by the launcher for its layers: a layer exits when that process dies."""


def exit_with_launcher(environ: dict[str, str]) -> None:
    """If started by ``zerolayer up``, asks the kernel for SIGHUP when the launcher dies
    (``prctl(PR_SET_PDEATHSIG)``, Linux), so a killed launcher leaves no orphaned layers. The
    distinct signal tells the layer that nobody else will clean up after it.

    Args:
        environ: the process environment (read at the process edge, passed in).
    """
    expected = environ.get(LAUNCHER_PID_ENV)
    if not expected:
        return
    import ctypes

    pr_set_pdeathsig = 1
    # NOTE: the symbols already loaded (libc's among them), not ctypes.util.find_library("c"),
    # which runs /sbin/ldconfig in a subprocess: tens of ms per layer at every start-up.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGHUP, 0, 0, 0)
    if os.getppid() != int(expected):  # the launcher died before the prctl took effect
        os._exit(1)


def setup_logging(layer: str, level: str = "INFO") -> None:
    """Configures the root logger to write ``layer`` tagged lines to stderr."""
    logging.basicConfig(
        level=level, format=f"%(asctime)s {layer} %(levelname)s %(name)s: %(message)s"
    )
