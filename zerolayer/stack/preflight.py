"""Checks of ``zerolayer up``'s settings against this machine, before any process starts.

:class:`zerolayer.stack.config.StackConfig` checks what a setting is on its own (ranges, syntax);
this module checks what it means here: the frontend's TLS and tenants files can be used, the
model can be read, the KV arena holds the blocks of the scheduler's warm-up request and fits its
filesystem, the TCP ports are free, the run directory can be made or is this user's private
directory (:mod:`zerolayer.stack.run_dir`), holds nothing but stale sockets at its socket paths
and no running stack uses it, and nothing but this user's private files sits at its KV arena's
path. Each failure is one :class:`PreflightError` naming the flag, so ``up`` fails with one line
instead of a layer crashing after the others started.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from zerolayer.checkpoints.checkpoint import CheckpointError, read_checkpoint
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.checkpoints.tokenizer_files import check_tokenizer_files
from zerolayer.checkpoints.weight_check import check_weights
from zerolayer.common.access import read_server_tls, read_tenants
from zerolayer.common.config import warm_up_num_blocks
from zerolayer.common.server import socket_path_error
from zerolayer.common.setting import SettingError
from zerolayer.common.settings import INTERNAL
from zerolayer.kv.arena_file import ArenaSizeError, check_arena_fits, sidecar_path
from zerolayer.kv.arena_layout import ArenaLayout, model_arena_layout
from zerolayer.kv.private_file import UntrustedFileError, open_private
from zerolayer.stack.config import SHM_DIR, StackConfig
from zerolayer.stack.launcher import stack_instance_id
from zerolayer.stack.run_dir import RunDirError, make_run_dir

MAX_UNIX_SOCKET_PATH = 107
"""Longest unix socket path Linux accepts (``sun_path`` is 108 bytes with the NUL)."""


class PreflightError(ValueError):
    """A setting of ``zerolayer up`` cannot work on this machine; the message starts with the
    flag (``--listen: ...``)."""

    def __init__(self, flag: str, reason: str) -> None:
        super().__init__(f"{flag}: {reason}")
        self.flag = flag


def check_stack(config: StackConfig, shm_dir: str = SHM_DIR) -> None:
    """Checks every setting that would otherwise fail in a started layer.

    Creates ``config.run_dir`` (mode 0700) when it is given and missing, as the launcher would;
    that check runs last, so a refused start leaves nothing behind.

    Args:
        config: the stack's settings.
        shm_dir: where the launcher creates the KV arena file (``device`` "cpu" only).

    Raises:
        PreflightError: the first setting that cannot work.
    """
    _check_access(config)
    layout, max_model_len = _arena_layout(config)
    _check_kv_cache_bytes(config, layout, max_model_len, shm_dir)
    _check_ports(config)
    if config.run_dir is not None and config.device == "cpu":
        _check_arena_path(config.run_dir, shm_dir)
    if config.run_dir is not None:
        # NOTE: the frontends' private sockets too (several frontends, or TLS)
        private = config.frontends > 1 or config.tls
        sockets = [s.name for s in config.slots if s.layer in INTERNAL or private]
        _make_run_dir(config.run_dir, sockets + (["fds"] if config.device != "cpu" else []))


def _check_access(config: StackConfig) -> None:
    """The frontend's TLS files and tenants file, read and checked as the frontend will."""
    try:
        read_server_tls(config)
        if config.tenants:
            read_tenants(config.tenants)
    except SettingError as exc:
        raise PreflightError(exc.setting.flag, exc.reason) from None


def _arena_layout(config: StackConfig) -> tuple[ArenaLayout, int]:
    """The kvstore's arena layout for the model, read as the loader reads it, and the model's
    context length."""
    try:
        manifest = read_checkpoint(Path(config.model_dir), dtype=config.dtype)
        model = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
        check_weights(manifest, model, config.dtype)
        check_tokenizer_files(manifest.tokenizer_json, manifest.tokenizer_config_json)
        layout = model_arena_layout(manifest, config.block_size, config.kv_cache_bytes)
        return layout, model.max_model_len
    except (CheckpointError, ValueError, OSError) as exc:  # ValueError: config.json, dtype
        raise PreflightError("--model", str(exc)) from None


def _check_kv_cache_bytes(
    config: StackConfig, layout: ArenaLayout, max_model_len: int, shm_dir: str
) -> None:
    if layout.num_blocks == 0:
        raise PreflightError(
            "--kv-cache-bytes",
            f"{config.kv_cache_bytes} is smaller than one KV block of this model "
            f"({_describe_block(layout)})",
        )
    min_num_blocks = warm_up_num_blocks(config.block_size, max_model_len)
    if layout.num_blocks < min_num_blocks:
        raise PreflightError(
            "--kv-cache-bytes",
            f"{config.kv_cache_bytes} holds {layout.num_blocks} KV block(s) of this model; the "
            f"scheduler's warm-up needs {min_num_blocks}: at least "
            f"{min_num_blocks * layout.block_bytes} bytes",
        )
    if config.device != "cpu":  # device memory: the kvstore's allocation reports it
        return
    try:
        check_arena_fits(shm_dir, layout.size_bytes)
    except ArenaSizeError as exc:
        raise PreflightError("--kv-cache-bytes", f"{config.kv_cache_bytes}: {exc.reason}") from None


def _describe_block(layout: ArenaLayout) -> str:
    return (
        f"{layout.block_bytes} bytes: K and V x {layout.num_layers} layers x "
        f"{layout.block_size} tokens x {layout.num_kv_heads} KV heads x {layout.head_dim} dims "
        f"x {layout.itemsize} bytes"
    )


def _check_arena_path(run_dir: str, shm_dir: str) -> None:
    """Checks that whatever sits at the arena's path of ``run_dir`` (a name anyone can predict),
    and at its sidecar's, is this user's private regular file (an arena a stopped kvstore left)."""
    shm_path = f"{shm_dir}/{stack_instance_id(Path(run_dir), owned=False)}.kv"
    for path in (shm_path, sidecar_path(shm_path)):
        try:
            os.close(open_private(path, os.O_RDONLY))
        except FileNotFoundError:
            pass
        except UntrustedFileError as exc:
            raise PreflightError(
                "--run-dir", f"{run_dir}: its KV arena's path is taken: {exc.reason}"
            ) from None


def _check_ports(config: StackConfig) -> None:
    host, _, port_text = config.listen.rpartition(":")
    listen_port = int(port_text)
    reason = bind_error(host, listen_port)
    if reason:
        raise PreflightError("--listen", f"{config.listen}: {reason}")
    if config.http_listen:
        http_host, _, http_port = config.http_listen.rpartition(":")
        reason = "the --listen port" if int(http_port) == listen_port else ""
        reason = reason or bind_error(http_host, int(http_port))
        if reason:
            raise PreflightError("--http-listen", f"{config.http_listen}: {reason}")
    if not config.metrics_port_base:
        return
    # NOTE: each port below is free now, but the stack's own listeners would collide with it.
    taken = {listen_port: "--listen"}
    if config.http_listen:
        taken.setdefault(int(config.http_listen.rpartition(":")[2]), "--http-listen")
    for slot in config.slots:
        port = config.metrics_port(slot.name)
        if port in taken:
            raise PreflightError(
                "--metrics-port-base",
                f"port {port} (the {slot.name}'s metrics) is the {taken[port]} port",
            )
        reason = bind_error(config.metrics_host, port)
        if reason:
            raise PreflightError(
                "--metrics-port-base",
                f"port {port} (the {slot.name}'s metrics) on {config.metrics_host}: {reason}",
            )


def bind_error(host: str, port: int) -> str:
    """Why a TCP server could not listen on ``host:port`` now ("" if it could).

    Binds every address ``host`` resolves to with ``SO_REUSEADDR``, as gRPC and Python's
    ``http.server`` do (so a port held only by connections in TIME_WAIT counts as free), and
    closes the sockets again. A port in use on any of them is an error; an address that cannot be
    bound only when none can (e.g. ``localhost`` without IPv6 still listens on 127.0.0.1).
    """
    try:
        infos = socket.getaddrinfo(
            host.removeprefix("[").removesuffix("]") or None,
            port,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )
    except socket.gaierror as exc:
        return f"cannot resolve {host!r} ({exc.strerror})"
    errors: list[OSError] = []
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                errors.append(exc)
    if any(exc.errno == errno.EADDRINUSE for exc in errors):
        return "the port is already in use"
    if errors and len(errors) == len(infos):
        return f"cannot listen there ({errors[0].strerror})"
    return ""


def _make_run_dir(run_dir: str, socket_names: list[str]) -> None:
    """Checks that the run directory can hold the sockets ``<name>.sock`` and that no running
    stack uses it, then makes it (mode 0700) or checks that the existing one is private to this
    user (never chmodded), and that nothing but this user's stale sockets sits at the socket
    paths."""
    path = Path(run_dir)
    longest = path / f"{max(socket_names, key=len)}.sock"
    if len(os.fsencode(longest.absolute())) > MAX_UNIX_SOCKET_PATH:
        raise PreflightError(
            "--run-dir",
            f"{run_dir}: too long for a unix socket path ({longest} over "
            f"{MAX_UNIX_SOCKET_PATH} bytes)",
        )
    for name in socket_names:  # the frontends listen on --listen
        socket_path = path / f"{name}.sock"
        if _accepts_connections(socket_path):
            raise PreflightError(
                "--run-dir",
                f"{run_dir}: in use by a running stack ({socket_path} accepts connections)",
            )
    try:
        make_run_dir(path)
    except RunDirError as exc:
        raise PreflightError("--run-dir", exc.reason) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PreflightError("--run-dir", f"{run_dir}: not writable")
    for name in socket_names:
        reason = socket_path_error(os.fspath(path / f"{name}.sock"))
        if reason:
            raise PreflightError("--run-dir", reason)


def _accepts_connections(socket_path: Path) -> bool:
    """Whether a process listens on the unix socket ``socket_path`` (a stale file: no)."""
    if not socket_path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(os.fspath(socket_path))
        except TimeoutError:  # a full backlog: someone listens
            return True
        except OSError:  # ECONNREFUSED: a stale file
            return False
    return True
