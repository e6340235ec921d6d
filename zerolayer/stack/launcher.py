"""Starts the layers as separate processes, waits until each is healthy, and stops them.

The CLI's ``zerolayer up`` and the end-to-end tests use this same launcher; its settings are a
:class:`zerolayer.stack.config.StackConfig`, its processes the slots of
:mod:`zerolayer.stack.layout` (one loader, one kvstore, the schedulers, the frontends), and the
supervisor that restarts them and promotes standby schedulers is
:mod:`zerolayer.stack.supervisor`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

import grpc

from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.common.server import (
    FAST_RECONNECT_CHANNEL_OPTIONS,
    FINAL_STOP,
    LAUNCHER_PID_ENV,
    instance_health_name,
)
from zerolayer.common.setting import command_line
from zerolayer.common.settings import (
    FRONTEND,
    KVSTORE,
    LAYERS,
    LOADER,
    SCHEDULER,
    layer_settings,
)
from zerolayer.kv.arena_file import sidecar_path
from zerolayer.sharing.fd_keeper import FdKeeper
from zerolayer.stack.config import SHM_DIR, StackConfig
from zerolayer.stack.health_watch import HealthTarget
from zerolayer.stack.kernel_build import (
    KernelSettingError,
    build_native_kernels,
    needs_native_kernels,
)
from zerolayer.stack.layout import frontend_instance_id
from zerolayer.stack.probes import SERVING, health_status, status_name
from zerolayer.stack.run_dir import RunDirError, make_run_dir, new_run_dir
from zerolayer.stack.still_starting import still_starting
from zerolayer.stack.supervisor import Supervisor

__all__ = ["LAYERS", "Stack", "StackConfig", "StackError", "StartupInterrupted"]

log = logging.getLogger(__name__)


POLL_CHANNEL_OPTIONS = FAST_RECONNECT_CHANNEL_OPTIONS
"""Options of the channel :meth:`Stack.wait_healthy` polls on: a process starts listening after
the first tries, and gRPC's reconnect backoff (up to 1 s with ``CHANNEL_OPTIONS``, 1.6 s and more
by default) would see it that much later; a takeover by a standby still starting waits on it."""


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
    """The processes of one zerolayer deployment on this machine, by slot name (``loader``,
    ``kvstore``, ``scheduler``, ``scheduler-1`` ..., ``frontend``, ``frontend-1`` ...)."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self._owns_run_dir = config.run_dir is None
        self.run_dir = Path(config.run_dir) if config.run_dir else new_run_dir()
        # NOTE: an existing directory is checked, never chmodded (see zerolayer.stack.run_dir).
        try:
            make_run_dir(self.run_dir)
        except RunDirError as exc:
            raise StackError(f"--run-dir: {exc.reason}") from None
        self.instance_id = stack_instance_id(self.run_dir, self._owns_run_dir)
        """The arena file's name and the first frontend's ``--instance-id``: one per run
        directory."""
        self.shm_path = f"{SHM_DIR}/{self.instance_id}.kv"
        self.device = config.device
        """Resolved by StackConfig ("auto" -> "cpu" or "cuda:0"), so the three layers agree."""
        self._fd_keeper: FdKeeper | None = None
        self.slots = {slot.name: slot for slot in config.slots}
        """Every process of the stack by name, in start order."""
        self.processes: dict[str, subprocess.Popen] = {}
        self.standby: set[str] = set(self.scheduler_names()[config.schedulers :])
        """Scheduler slots whose process is (or starts as) a standby; the supervisor moves a
        slot out when it promotes its process, and in when a dead active one restarts."""
        self.num_restarts: dict[str, int] = dict.fromkeys(self.slots, 0)
        # Shared with the supervisor (zerolayer.stack.supervisor):
        self.held: set[str] = set()
        """Processes stopped on purpose (not restarted by the supervisor)."""
        self.lock = threading.Lock()
        """Guards ``processes``, ``held`` and ``standby`` between the caller and the supervisor."""
        self.stopping = threading.Event()
        """Set by :meth:`stop`: the supervisor starts nothing any more."""
        self.layers_down = threading.Event()
        """Set by :meth:`stop` once every process is down: the supervisor thread may end."""
        self._interrupted = threading.Event()
        self._supervisor: threading.Thread | None = None

    def scheduler_names(self) -> list[str]:
        """The scheduler slots, in start order (``scheduler``, ``scheduler-1`` ...)."""
        return [name for name, slot in self.slots.items() if slot.layer == SCHEDULER]

    def address(self, name: str) -> str:
        """gRPC address of a process: the public one for every frontend, a unix socket named
        after the slot for the others."""
        if self.slots[name].layer == FRONTEND:
            return self.config.listen
        return f"unix:{self.run_dir / f'{name}.sock'}"

    def private_address(self, name: str) -> str:
        """Where frontend ``name`` alone is reached, when the frontends share the public port or
        serve TLS: a unix socket named after the slot in the private run directory; "" for
        every other process and setup."""
        if self.slots[name].layer != FRONTEND or not (self.config.frontends > 1 or self.config.tls):
            return ""
        return f"unix:{self.run_dir / f'{name}.sock'}"

    def wiring(self, name: str) -> dict[str, object]:
        """The settings the launcher gives process ``name`` from the stack's layout (by setting
        name), beside the user's in ``config``; its layer takes those it declares."""
        slot = self.slots[name]
        return {
            "address": self.address(name),
            "metrics_port": self.config.metrics_port(name),
            "loader_address": self.address(LOADER),
            "kvstore_address": self.address(KVSTORE),
            "pin_kvstore_address": self.address(KVSTORE),
            # NOTE: a list: the frontend gets the flag once per scheduler, standbys included
            # (it routes by their health).
            "scheduler_address": tuple(self.address(n) for n in self.scheduler_names()),
            "shm_path": self.shm_path,
            # NOTE: the keeper only holds device memory; a CPU stack runs none.
            "fd_keeper": str(self.run_dir / "fds.sock") if self.device != "cpu" else "",
            "instance_id": frontend_instance_id(self.instance_id, slot.index),
            "standby": name in self.standby,
            "reuse_port": self.config.frontends > 1,
            "private_address": self.private_address(name),
        }

    def command(self, name: str) -> list[str]:
        """The command line that runs process ``name`` alone: its layer's flags from ``config``
        and :meth:`wiring`, each left out at the layer's default."""
        values = {field.name: getattr(self.config, field.name) for field in fields(self.config)}
        values |= self.wiring(name)
        layer = self.slots[name].layer
        flags = command_line(layer_settings(layer), values)
        return [sys.executable, "-m", f"zerolayer.{layer}", *flags]

    @staticmethod
    def working_dir() -> Path:
        """Where every process runs: the directory holding the ``zerolayer`` package."""
        return Path(__file__).resolve().parents[2]

    def health_target(self, name: str) -> HealthTarget:
        """Where process ``name`` reports its health: a frontend under its instance name, on
        its private address when the frontends share the public port or it serves TLS."""
        slot = self.slots[name]
        if slot.layer != FRONTEND:
            return HealthTarget(self.address(name), layer=slot.layer)
        instance_id = frontend_instance_id(self.instance_id, slot.index)
        # NOTE: the frontend is asked by instance name: on its TCP port another stack could
        # answer (the other layers' unix sockets are private to this stack). With TLS, its
        # private address serves health in plaintext, so no probe needs a certificate.
        address = self.private_address(name) or self.address(name)
        return HealthTarget(address, instance_health_name(instance_id), slot.layer)

    def health_targets(self) -> dict[str, HealthTarget]:
        """Where each process reports its health."""
        return {name: self.health_target(name) for name in self.slots}

    def start(self) -> None:
        """Builds the native kernels where the schedulers need them and they are not built yet
        (without a deadline), then starts every process at once (each waits for the layers it
        needs) and waits until all are SERVING (a standby scheduler: on "").

        Raises:
            CheckpointError: the model directory is not a loadable checkpoint.
            StackError: a process exited or was not healthy within ``startup_timeout_s`` of its
                start; every started process is stopped again.
            StartupInterrupted: :meth:`interrupt` was called (before the next process starts,
                or while they start up); every started process is stopped.
        """
        # NOTE: a bad --model fails here, not in a child
        read_checkpoint(Path(self.config.model_dir), dtype=self.config.dtype)
        try:
            if self.device != "cpu" and self._fd_keeper is None:
                # Holds the VMM descriptors of the weights and the KV arena, so that a restarted
                # loader or kvstore maps the same device memory (zerolayer.sharing.fd_keeper).
                self._fd_keeper = FdKeeper(self.run_dir / "fds.sock")
            if needs_native_kernels(self.config):
                self._build_kernels()
            for name in self.slots:
                # NOTE: checked per process, so a signal stops a start-up of many at once
                if self._interrupted.is_set():
                    raise StartupInterrupted(f"interrupted before starting the {name}")
                self.start_layer(name)
            deadline = time.monotonic() + self.config.startup_timeout_s
            for name in self.slots:
                self.wait_healthy(name, deadline)
        except BaseException:
            self.stop()
            raise
        # Without --supervise the thread still watches: it logs exits instead of restarting.
        self._supervisor = threading.Thread(
            target=Supervisor(self).run, name="supervisor", daemon=True
        )
        self._supervisor.start()

    def _build_kernels(self) -> None:
        """Builds the schedulers' kernels first, so that ``startup_timeout_s`` does not count the
        build (:mod:`zerolayer.stack.kernel_build`), in the variant ``$ZEROLAYER_CPU_ISA`` names
        (the build program and the schedulers inherit this environment); a failed build is
        logged, not fatal; an unknown variant raises StackError (before any layer starts)."""
        try:
            reason = build_native_kernels(self.working_dir(), self._interrupted.is_set)
        except InterruptedError as exc:
            raise StartupInterrupted(str(exc)) from None
        except KernelSettingError as exc:
            raise StackError(str(exc)) from None
        if reason is not None:
            log.warning(
                "zerolayer: native kernels not built (%s); the scheduler serves on the pure-torch "
                "path",
                reason.splitlines()[0],
            )

    def interrupt(self) -> None:
        """Makes a :meth:`start` in progress stop the started layers and raise
        :class:`StartupInterrupted` (safe to call from a signal handler)."""
        self._interrupted.set()

    def start_layer(self, name: str) -> subprocess.Popen:
        """Starts process ``name`` (replacing a dead one); the supervisor watches it again."""
        self.held.discard(name)
        stderr = None
        if self.config.log_dir is not None:
            Path(self.config.log_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            # NOTE: this user's only (logs may quote prompts); a symlink there is not followed,
            # and a file another user put there (in a shared directory) is not written to.
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            log_path = Path(self.config.log_dir) / f"{name}.log"
            stderr = open(os.open(log_path, flags, 0o600), "ab")  # noqa: SIM115
            info = os.fstat(stderr.fileno())
            if info.st_uid != os.geteuid() or not stat.S_ISREG(info.st_mode):
                stderr.close()
                raise StackError(f"{log_path}: not a file of this user; not writing logs to it")
        # NOTE: own session, so a terminal's Ctrl-C reaches only the launcher, which then stops
        # the layers in order; the layers exit by themselves if the launcher dies.
        process = subprocess.Popen(
            self.command(name),
            stdin=subprocess.DEVNULL,
            stderr=stderr,
            cwd=self.working_dir(),
            start_new_session=True,
            env={**os.environ, LAUNCHER_PID_ENV: str(os.getpid())},
        )
        if stderr is not None:
            stderr.close()
        self.processes[name] = process
        return process

    def wait_healthy(self, name: str, deadline: float) -> None:
        """Polls the process's gRPC health (:meth:`health_target`) until SERVING.

        Raises:
            StackError: the process exited or the deadline passed.
            StartupInterrupted: :meth:`interrupt` was called during :meth:`start`.
        """
        target = self.health_target(name)
        with grpc.insecure_channel(target.address, options=POLL_CHANNEL_OPTIONS) as channel:
            while True:
                # start() only: a restart by the supervisor is not interrupted
                if self._interrupted.is_set() and self._supervisor is None:
                    raise StartupInterrupted(f"interrupted while waiting for the {name}")
                process = self.processes[name]
                if process.poll() is not None:
                    raise StackError(
                        f"{name} exited with code {process.returncode}{self._log_tail(name)}"
                    )
                health = health_status(channel, target.service)
                if health == SERVING:
                    return
                if time.monotonic() > deadline:
                    timeout_s = self.config.startup_timeout_s
                    state = status_name(health)
                    why = still_starting(name, process.pid, state, timeout_s, self._log(name))
                    raise StackError(f"{why}{self._log_tail(name)}")
                time.sleep(0.05)

    def _log(self, name: str) -> Path | None:
        return None if self.config.log_dir is None else Path(self.config.log_dir) / f"{name}.log"

    def _log_tail(self, name: str) -> str:
        path = self._log(name)
        if path is None or not path.exists():
            return ""
        return "\n--- " + str(path) + " ---\n" + path.read_text(errors="replace")[-3000:]

    def stop_layer(
        self, name: str, timeout_s: float = 10.0, signum: signal.Signals = signal.SIGTERM
    ) -> None:
        """Stops process ``name`` on purpose (the supervisor leaves it down): ``signum``, then
        SIGKILL after ``timeout_s`` seconds. SIGTERM: it may be started again (the kvstore keeps
        its arena); :data:`zerolayer.common.server.FINAL_STOP`: the stack ends."""
        with self.lock:
            self.held.add(name)
            process = self.processes.get(name)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Stops every process (frontends first, the loader last) and removes the sockets and
        the shared memory."""
        self.stopping.set()
        for name in reversed(self.slots):
            self.stop_layer(name, signum=FINAL_STOP)
        self.layers_down.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=30)
        if self._fd_keeper is not None:
            self._fd_keeper.close()  # the device memory is freed with the last mapping
            self._fd_keeper = None
        for path in (self.shm_path, sidecar_path(self.shm_path)):
            # NOTE: removes the name only (a symlink is not followed); another user's file in the
            # sticky /dev/shm, which the kvstore refused to use, cannot be removed and stays.
            with contextlib.suppress(FileNotFoundError, PermissionError):
                os.unlink(path)
        if self._owns_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        else:
            for name, slot in self.slots.items():
                address = (
                    self.address(name) if slot.layer != FRONTEND else self.private_address(name)
                )
                if address:
                    Path(address.removeprefix("unix:")).unlink(missing_ok=True)

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
