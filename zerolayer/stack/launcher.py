"""Starts the four layers as separate processes, waits until each is healthy, and stops them.

The CLI's ``zerolayer up`` and the end-to-end tests use this same launcher; its settings are a
:class:`zerolayer.stack.config.StackConfig`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import fields
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.common.server import LAUNCHER_PID_ENV, instance_health_name
from zerolayer.common.setting import command_line
from zerolayer.common.settings import layer_settings
from zerolayer.kv.arena_file import sidecar_path
from zerolayer.sharing.fd_keeper import FdKeeper
from zerolayer.stack.config import LAYERS, SHM_DIR, StackConfig
from zerolayer.stack.health_watch import HealthTarget, HealthWatch

log = logging.getLogger(__name__)


class StackError(RuntimeError):
    """A layer failed to start or died."""


class StartupInterrupted(StackError):
    """:meth:`Stack.interrupt` was called while :meth:`Stack.start` waited for the layers."""


def stack_instance_id(run_dir: Path, owned: bool) -> str:
    """A name for the stack that uses ``run_dir``, unique per absolute run directory.

    Args:
        run_dir: the stack's run directory.
        owned: ``run_dir`` is a new temporary directory (its name alone is unique); otherwise the
            name gets a short hash of the absolute path, so ``/a/run`` and ``/b/run`` differ.
    """
    if owned:
        return run_dir.name
    digest = hashlib.sha256(os.fsencode(run_dir.absolute())).hexdigest()[:8]
    return f"{run_dir.name}-{digest}"


class Stack:
    """The four layer processes of one zerolayer deployment on this machine."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self._owns_run_dir = config.run_dir is None
        self.run_dir = Path(config.run_dir or tempfile.mkdtemp(prefix="zerolayer-"))
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        self.instance_id = stack_instance_id(self.run_dir, self._owns_run_dir)
        """The frontend's ``--instance-id`` and the arena file's name: one per run directory."""
        self.shm_path = f"{SHM_DIR}/{self.instance_id}.kv"
        self.device = config.device
        self._fd_keeper: FdKeeper | None = None
        """Resolved by StackConfig ("auto" -> "cpu" or "cuda:0"), so the three layers agree."""
        self.processes: dict[str, subprocess.Popen] = {}
        self._held: set[str] = set()
        """Layers stopped on purpose (not restarted by the supervisor)."""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._interrupted = threading.Event()
        self._layers_down = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.num_restarts: dict[str, int] = dict.fromkeys(LAYERS, 0)

    def address(self, layer: str) -> str:
        """gRPC address of a layer (the frontend's public one, unix sockets for the others)."""
        if layer == "frontend":
            return self.config.listen
        return f"unix:{self.run_dir / f'{layer}.sock'}"

    def wiring(self) -> dict[str, object]:
        """The settings the launcher gives the layers from the stack's layout (by setting name),
        beside the user's in ``config``; each layer takes those it declares."""
        return {
            "loader_address": self.address("loader"),
            "kvstore_address": self.address("kvstore"),
            "scheduler_address": self.address("scheduler"),
            "shm_path": self.shm_path,
            # NOTE: the keeper only holds device memory; a CPU stack runs none.
            "fd_keeper": str(self.run_dir / "fds.sock") if self.device != "cpu" else "",
            "instance_id": self.instance_id,
        }

    def command(self, layer: str) -> list[str]:
        """The command line that runs ``layer`` alone: its flags from ``config`` and
        :meth:`wiring`, each left out at the layer's default."""
        values = {field.name: getattr(self.config, field.name) for field in fields(self.config)}
        values |= self.wiring()
        values |= {"address": self.address(layer), "metrics_port": self.config.metrics_port(layer)}
        flags = command_line(layer_settings(layer), values)
        return [sys.executable, "-m", f"zerolayer.{layer}", *flags]

    def start(self) -> None:
        """Starts all layers at once (each waits for the ones it needs) and waits until all are
        SERVING.

        Raises:
            CheckpointError: the model directory is not a loadable checkpoint.
            StackError: a layer exited or was not healthy within ``startup_timeout_s``; every
                started layer is stopped again.
            StartupInterrupted: :meth:`interrupt` was called; every started layer is stopped.
        """
        read_checkpoint(Path(self.config.model_dir))  # a bad --model fails here, not in a child
        try:
            if self.device != "cpu" and self._fd_keeper is None:
                # Holds the VMM descriptors of the weights and the KV arena, so that a restarted
                # loader or kvstore maps the same device memory (zerolayer.sharing.fd_keeper).
                self._fd_keeper = FdKeeper(self.run_dir / "fds.sock")
            for layer in LAYERS:
                self.start_layer(layer)
            deadline = time.monotonic() + self.config.startup_timeout_s
            for layer in LAYERS:
                self.wait_healthy(layer, deadline)
        except BaseException:
            self.stop()
            raise
        # Without --supervise the thread still watches: it logs exits instead of restarting.
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self._supervisor.start()

    def interrupt(self) -> None:
        """Makes a :meth:`start` in progress stop the started layers and raise
        :class:`StartupInterrupted` (safe to call from a signal handler)."""
        self._interrupted.set()

    def health_targets(self) -> dict[str, HealthTarget]:
        """Where each layer reports its health (the frontend under its instance name)."""
        return {
            layer: HealthTarget(
                self.address(layer),
                instance_health_name(self.instance_id) if layer == "frontend" else "",
            )
            for layer in LAYERS
        }

    def _supervise(self) -> None:
        """Restarts layers that exit unexpectedly, with exponential backoff per layer (only logs
        the exit when ``supervise`` is off), and logs layers that stop serving or answering while
        alive (:class:`HealthWatch`)."""
        watch = HealthWatch(self.health_targets())
        try:
            self._supervise_loop(watch)
        finally:
            watch.close()
            # NOTE: layers restarted from this thread get PR_SET_PDEATHSIG from it (the signal
            # follows the parent *thread*), so it must outlive them: stop() takes them down in
            # order (SIGTERM, frontend first) before this thread may end.
            self._layers_down.wait()

    def _supervise_loop(self, watch: HealthWatch) -> None:
        failures = dict.fromkeys(LAYERS, 0)
        up_since = dict.fromkeys(LAYERS, time.monotonic())
        reported_exits: set[int] = set()
        while not self._stopping.wait(0.1):
            with self._lock:
                alive = {
                    layer: process.pid
                    for layer, process in self.processes.items()
                    if layer not in self._held and process.poll() is None
                }
            watch.poll(alive)
            for layer in LAYERS:
                with self._lock:
                    process = self.processes.get(layer)
                    dead = (
                        layer not in self._held
                        and process is not None
                        and process.poll() is not None
                    )
                if not dead or process.pid in reported_exits:
                    continue
                if not self.config.supervise:
                    reported_exits.add(process.pid)
                    log.error(
                        "zerolayer: %s exited with code %s; not restarted (--no-supervise): "
                        "requests that need it fail with UNAVAILABLE",
                        layer,
                        process.returncode,
                    )
                    continue
                if time.monotonic() - up_since[layer] > 30:
                    failures[layer] = 0
                failures[layer] += 1
                delay = min(0.25 * 2 ** (failures[layer] - 1), self.config.max_restart_backoff_s)
                log.warning(
                    "zerolayer: %s exited with code %s; restarting it in %.2f s (restart #%d)",
                    layer,
                    process.returncode,
                    delay,
                    self.num_restarts[layer] + 1,
                )
                if self._stopping.wait(delay):
                    return
                self._restart(layer)
                up_since[layer] = time.monotonic()

    def _restart(self, layer: str) -> None:
        with self._lock:
            if layer in self._held or self._stopping.is_set():
                return
            self.start_layer(layer)
            self.num_restarts[layer] += 1
        try:
            self.wait_healthy(layer, time.monotonic() + self.config.startup_timeout_s)
            log.warning("zerolayer: %s is back (pid %d)", layer, self.processes[layer].pid)
        except StackError as exc:
            log.error("zerolayer: %s did not come back: %s", layer, exc)

    def start_layer(self, layer: str) -> subprocess.Popen:
        """Starts one layer's process (replacing a dead one); the supervisor watches it again."""
        self._held.discard(layer)
        stderr = None
        if self.config.log_dir is not None:
            Path(self.config.log_dir).mkdir(parents=True, exist_ok=True)
            stderr = open(Path(self.config.log_dir) / f"{layer}.log", "ab")  # noqa: SIM115
        # NOTE: own session, so a terminal's Ctrl-C reaches only the launcher, which then stops
        # the layers in order; the layers exit by themselves if the launcher dies.
        process = subprocess.Popen(
            self.command(layer),
            stdin=subprocess.DEVNULL,
            stderr=stderr,
            cwd=Path(__file__).resolve().parents[2],
            start_new_session=True,
            env={**os.environ, LAUNCHER_PID_ENV: str(os.getpid())},
        )
        if stderr is not None:
            stderr.close()
        self.processes[layer] = process
        return process

    def wait_healthy(self, layer: str, deadline: float) -> None:
        """Polls the layer's gRPC health service until SERVING.

        Raises:
            StackError: the process exited or the deadline passed.
        """
        target = self.address(layer)
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                # start() only: a restart by the supervisor is not interrupted
                if self._interrupted.is_set() and self._supervisor is None:
                    raise StartupInterrupted(f"interrupted while waiting for the {layer}")
                process = self.processes[layer]
                if process.poll() is not None:
                    raise StackError(
                        f"{layer} exited with code {process.returncode}{self._log_tail(layer)}"
                    )
                try:
                    # NOTE: the frontend is asked by instance name: on its TCP port another stack
                    # could answer (the other layers' unix sockets are private to this stack).
                    check = health_pb2.HealthCheckRequest(
                        service=instance_health_name(self.instance_id)
                        if layer == "frontend"
                        else ""
                    )
                    status = stub.Check(check, timeout=1.0).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise StackError(f"{layer} not healthy in time{self._log_tail(layer)}")
                time.sleep(0.05)

    def _log_tail(self, layer: str) -> str:
        if self.config.log_dir is None:
            return ""
        path = Path(self.config.log_dir) / f"{layer}.log"
        if not path.exists():
            return ""
        return "\n--- " + str(path) + " ---\n" + path.read_text(errors="replace")[-3000:]

    def stop_layer(self, layer: str, timeout_s: float = 10.0) -> None:
        """Stops one layer on purpose (the supervisor leaves it down): SIGTERM, then SIGKILL
        after ``timeout_s``."""
        with self._lock:
            self._held.add(layer)
            process = self.processes.get(layer)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Stops every layer (frontend first) and removes the sockets and the shared memory."""
        self._stopping.set()
        for layer in reversed(LAYERS):
            self.stop_layer(layer)
        self._layers_down.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=30)
        if self._fd_keeper is not None:
            self._fd_keeper.close()  # the device memory is freed with the last mapping
            self._fd_keeper = None
        for path in (self.shm_path, sidecar_path(self.shm_path)):
            if os.path.exists(path):
                os.unlink(path)
        if self._owns_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        else:
            for layer in LAYERS[:3]:
                Path(self.address(layer).removeprefix("unix:")).unlink(missing_ok=True)

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
