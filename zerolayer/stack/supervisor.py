"""The supervisor of a running stack: restarts processes that exit, hands an active scheduler's
work to a standby when it dies, and logs processes that stop serving while alive.

- **Exits** are seen at once (a pidfd per process, polled with the stop event every 0.1 s).
  A process that exits unexpectedly is restarted with backoff (0.25 s doubling up to
  ``max_restart_backoff_s``, reset after 30 s up); ``stop_layer`` (an intended stop) is not.
  Restarts never block the supervisor: a started process is waited for on a thread of its own,
  which logs when it is back.
- **Takeover**: when an active scheduler exits and a standby lives, the supervisor activates the
  standby at once (``Scheduler/Activate``: its health turns SERVING on ``zerolayer.v1.Scheduler``,
  where the frontends route) and restarts the dead slot as the new standby. A standby that is
  still starting (a restart of its own) cannot be activated yet: it is given the active role at
  once all the same, and activated when it reports SERVING on "", so the dead slot still comes
  back as the standby and the number of active schedulers stays ``--schedulers``. Without a
  live standby the dead slot restarts as an active scheduler, as a lone scheduler always did.
- **Health** of live processes is watched by :class:`HealthWatch` on a thread of its own, so a
  hung process (its checks time out) never delays a takeover.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from zerolayer.common.settings import SCHEDULER
from zerolayer.stack.health_watch import HealthWatch
from zerolayer.stack.probes import activate_scheduler, is_serving

if TYPE_CHECKING:
    from subprocess import Popen

    from zerolayer.stack.launcher import Stack

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.25
"""Wait before the first restart of a process that exited, seconds (doubles per exit)."""
STABLE_AFTER_S = 30.0
"""A process up this long starts its backoff again at :data:`FIRST_BACKOFF_S`, seconds."""
POLL_S = 0.1
"""Longest the supervisor sleeps between two looks at the processes, seconds."""


@dataclass
class _Slot:
    """The supervisor's memory of one slot."""

    failures: int = 0
    """Exits since the slot was last up for :data:`STABLE_AFTER_S`."""
    up_since: float = 0.0
    restart_at: float | None = None
    """When to start the slot's process again (monotonic seconds); None: no restart due."""
    handled_pid: int = 0
    """The last exited process already dealt with (an exit is handled once)."""


class Supervisor:
    """Runs on the stack's ``supervisor`` thread (:meth:`run`) until the stack stops."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self._slots = {name: _Slot(up_since=time.monotonic()) for name in stack.slots}
        self._pidfds: dict[int, int] = {}
        """pid -> pidfd of the processes being watched for their exit."""
        self._to_activate: set[str] = set()
        """Active scheduler slots whose process started as a standby and is not activated yet
        (it was still starting when it took over); activated once it serves."""
        self._ready: set[str] = set()
        """Those of :attr:`_to_activate` whose process serves: activation is due."""
        self._failed_once: set[str] = set()
        """Those of :attr:`_ready` whose activation failed (logged once)."""
        self._back: queue.SimpleQueue[str] = queue.SimpleQueue()
        """Restarted processes that serve again, from their ``wait-<name>`` threads."""

    def run(self) -> None:
        """Supervises until the stack stops; then waits until its processes are down.

        NOTE: processes restarted from this thread get PR_SET_PDEATHSIG from it (the signal
        follows the parent *thread*), so it must outlive them: ``Stack.stop`` takes them down
        in order (SIGTERM, frontends first) before this thread may end.
        """
        watcher = threading.Thread(target=self._watch_health, name="health-watch", daemon=True)
        watcher.start()
        try:
            while not self._stack.stopping.is_set():
                self._wait_for_an_exit(POLL_S)
                for name in self._stack.slots:
                    self._check_exit(name)
                self._restart_due()
                self._activate_ready()
        finally:
            for fd in self._pidfds.values():
                os.close(fd)
            watcher.join(timeout=5)
            self._stack.layers_down.wait()

    def _watch_health(self) -> None:
        """Logs live processes that stop serving or answering (see :class:`HealthWatch`)."""
        watch = HealthWatch(self._stack.health_targets())
        try:
            while not self._stack.stopping.wait(POLL_S):
                watch.poll(self._live_pids())
        finally:
            watch.close()

    def _live_pids(self) -> dict[str, int]:
        """Process name -> pid of every live process the stack did not stop on purpose."""
        with self._stack.lock:
            return {
                name: process.pid
                for name, process in self._stack.processes.items()
                if name not in self._stack.held and process.poll() is None
            }

    def _wait_for_an_exit(self, timeout_s: float) -> None:
        """Returns when a watched process exits, or after ``timeout_s`` seconds."""
        live = self._live_pids().values()
        for pid in set(self._pidfds) - set(live):
            os.close(self._pidfds.pop(pid))
        poller = select.poll()
        for pid in live:
            if pid not in self._pidfds:
                try:
                    self._pidfds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:  # gone already: the check below sees it
                    return
            poller.register(self._pidfds[pid], select.POLLIN)
        poller.poll(timeout_s * 1000)

    def _check_exit(self, name: str) -> None:
        """Deals once with the exit of ``name``'s process: takeover, then restart or log."""
        stack = self._stack
        with stack.lock:
            process = stack.processes.get(name)
            exited = name not in stack.held and process is not None and process.poll() is not None
        state = self._slots[name]
        if not exited or state.handled_pid == process.pid:
            return
        state.handled_pid = process.pid
        self._to_activate.discard(name)
        self._ready.discard(name)
        took_over = self._take_over(name, process) if self._is_active_scheduler(name) else ""
        if not stack.config.supervise:
            log.error(
                "zerolayer: %s exited with code %s; not restarted (--no-supervise): "
                "requests that need it fail with UNAVAILABLE",
                name,
                process.returncode,
            )
            return
        self._schedule_restart(name, process, " as the new standby" if took_over else "")

    def _is_active_scheduler(self, name: str) -> bool:
        return self._stack.slots[name].layer == SCHEDULER and name not in self._stack.standby

    def _take_over(self, dead: str, process: Popen) -> str:
        """Activates a live standby scheduler (a warmed one first) in place of the active
        scheduler ``dead``, and makes ``dead``'s slot the standby's; logs how long that took.
        When none answers, the first is still starting: it gets the role and is activated by
        :meth:`_activate_ready` once it serves.

        Returns:
            The promoted slot's name; "" when no standby lives.
        """
        start = time.monotonic()
        stack = self._stack
        live = self._live_pids()
        candidates = [name for name in stack.scheduler_names() if name in stack.standby]
        candidates = [name for name in candidates if name in live]
        candidates.sort(key=lambda name: not is_serving(stack.address(name)))
        for name in candidates:
            try:
                activate_scheduler(stack.address(name))
            except grpc.RpcError as exc:
                log.warning("zerolayer: could not activate the standby %s: %s", name, exc.code())
                continue
            self._swap_roles(name, dead)
            log.warning(
                "zerolayer: %s (pid %d) exited with code %s; the standby %s (pid %d) took over "
                "as active in %.0f ms",
                dead,
                process.pid,
                process.returncode,
                name,
                live[name],
                (time.monotonic() - start) * 1e3,
            )
            return name
        if not candidates:
            return ""
        # NOTE: a standby that does not answer yet is starting (a restart): it takes the role
        # now and is activated when it serves, so that the dead slot comes back as the standby.
        name = candidates[0]
        self._swap_roles(name, dead)
        self._to_activate.add(name)
        log.warning(
            "zerolayer: %s (pid %d) exited with code %s; the standby %s (pid %d) is still "
            "starting: it takes over as active once it serves",
            dead,
            process.pid,
            process.returncode,
            name,
            live[name],
        )
        return name

    def _swap_roles(self, standby: str, dead: str) -> None:
        """Makes the slot ``standby`` an active one and ``dead`` (an active one) the standby."""
        with self._stack.lock:
            self._stack.standby.discard(standby)
            self._stack.standby.add(dead)

    def _activate_ready(self) -> None:
        """Activates the slots of :attr:`_to_activate` whose process serves (retried each round
        until it answers); a failed try is logged once."""
        while not self._back.empty():
            name = self._back.get()
            if name in self._to_activate:
                self._ready.add(name)
        for name in sorted(self._ready):
            try:
                activate_scheduler(self._stack.address(name))
            except grpc.RpcError as exc:
                if name not in self._failed_once:
                    log.warning("zerolayer: could not activate %s yet: %s", name, exc.code())
                self._failed_once.add(name)
                continue
            self._ready.discard(name)
            self._to_activate.discard(name)
            self._failed_once.discard(name)
            log.warning("zerolayer: %s took over as active", name)

    def _schedule_restart(self, name: str, process: Popen, role: str) -> None:
        """Plans the restart of ``name`` after its backoff, and logs it."""
        state = self._slots[name]
        now = time.monotonic()
        if now - state.up_since > STABLE_AFTER_S:
            state.failures = 0
        state.failures += 1
        delay = min(
            FIRST_BACKOFF_S * 2 ** (state.failures - 1), self._stack.config.max_restart_backoff_s
        )
        state.restart_at = now + delay
        log.warning(
            "zerolayer: %s exited with code %s; restarting it%s in %.2f s (restart #%d)",
            name,
            process.returncode,
            role,
            delay,
            self._stack.num_restarts[name] + 1,
        )

    def _restart_due(self) -> None:
        """Starts the processes whose backoff has passed; a thread waits for each to serve."""
        now = time.monotonic()
        stack = self._stack
        for name, state in self._slots.items():
            if state.restart_at is None or now < state.restart_at:
                continue
            state.restart_at = None
            with stack.lock:
                if name in stack.held or stack.stopping.is_set():
                    continue
                stack.start_layer(name)
                stack.num_restarts[name] += 1
            state.up_since = time.monotonic()
            threading.Thread(
                target=self._wait_back, args=(name,), name=f"wait-{name}", daemon=True
            ).start()

    def _wait_back(self, name: str) -> None:
        """Logs when the restarted process ``name`` serves, or that it did not come back."""
        stack = self._stack
        try:
            stack.wait_healthy(name, time.monotonic() + stack.config.startup_timeout_s)
            self._back.put(name)
            role = " as a standby" if name in stack.standby else ""
            log.warning("zerolayer: %s is back%s (pid %d)", name, role, stack.processes[name].pid)
        except Exception as exc:  # noqa: BLE001 - StackError, or the stack stopping under it
            if not stack.stopping.is_set():
                log.error("zerolayer: %s did not come back: %s", name, exc)
