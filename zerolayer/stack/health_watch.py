"""The supervisor's view of layers that are alive but stop serving (e.g. a scheduler whose GPU had
a fatal error): it polls each layer's ``grpc.health.v1`` status and logs the change, with the
reason the layer gives (the scheduler's ``GetStats.not_serving_reason``), and logs a live layer
that stops answering at all (hung, or stopped with SIGSTOP). It only reports: restarting a layer
that is merely slow would cut its requests off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.common.server import CHANNEL_OPTIONS
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass(frozen=True)
class HealthTarget:
    """Where a layer reports its health."""

    address: str
    service: str = ""
    """Health service name to ask for ("" = the whole server)."""
    layer: str = ""
    """The layer the process runs ("scheduler" for ``scheduler-1`` too): how to ask it why it
    stopped serving (:data:`REASONS`); "": the name it is watched under."""


def scheduler_reason(channel: grpc.Channel) -> str:
    """Why the scheduler on ``channel`` stopped serving ("" if it does not say or cannot)."""
    try:
        stats = scheduler_pb2_grpc.SchedulerStub(channel).GetStats(
            scheduler_pb2.SchedulerStatsRequest(), timeout=1.0
        )
    except grpc.RpcError:
        return ""
    return stats.not_serving_reason


REASONS: dict[str, Callable[[grpc.Channel], str]] = {"scheduler": scheduler_reason}
"""Per layer, how to ask one of its processes why it stopped serving."""


class HealthWatch:
    """Polls the health of running layers (at most every ``interval_s``) and logs when one that
    was SERVING reports NOT_SERVING while its process lives on, and when it serves again.

    A new process (a restart) starts a new history when it first reports SERVING, so its
    start-up is never reported. Not thread-safe: one thread (the supervisor's health watch)
    calls :meth:`poll`.
    """

    def __init__(
        self,
        targets: Mapping[str, HealthTarget],
        interval_s: float = 0.5,
        unresponsive_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            targets: per layer, where it reports its health.
            interval_s: least time between two polls, seconds.
            unresponsive_after_s: a live process that answered before and has not answered
                (no status within 0.5 s) for this long is logged as unresponsive, seconds.
            clock: monotonic seconds (tests inject one).
        """
        self._targets = dict(targets)
        self._interval_s = interval_s
        self._unresponsive_after_s = unresponsive_after_s
        self._clock = clock
        self._unanswered: dict[str, tuple[int, float, bool]] = {}
        """layer -> (pid, first unanswered check, logged) while a layer that answered does not."""
        self._channels: dict[str, grpc.Channel] = {}
        self._last: dict[str, tuple[int, int]] = {}
        """layer -> (pid, last status seen)."""
        self._next_poll = 0.0

    def poll(self, pids: Mapping[str, int]) -> None:
        """Checks each layer in ``pids`` (layer -> pid of its live process) if the interval has
        passed; logs changes."""
        now = self._clock()
        if now < self._next_poll:
            return
        self._next_poll = now + self._interval_s
        for layer, pid in pids.items():
            status = self._check(layer)
            if status is None:
                self._no_answer(layer, pid, now)
                continue
            unanswered = self._unanswered.pop(layer, None)
            if unanswered is not None and unanswered[0] == pid and unanswered[2]:
                log.warning("zerolayer: %s (pid %d) answers health checks again", layer, pid)
            previous = self._last.get(layer)
            if (previous is None or previous[0] != pid) and status != SERVING:
                continue  # still starting: a process's history begins when it first serves
            self._last[layer] = (pid, status)
            if previous is None or previous[0] != pid or previous[1] == status:
                continue
            if status == SERVING:
                log.warning("zerolayer: %s is serving again", layer)
            else:
                ask = REASONS.get(self._targets[layer].layer or layer)
                reason = ask(self._channel(layer)) if ask is not None else ""
                log.error(
                    "zerolayer: %s (pid %d) stopped serving: %s",
                    layer,
                    pid,
                    reason or "it gives no reason",
                )

    def _no_answer(self, layer: str, pid: int, now: float) -> None:
        """A process still starting (never answered) or about to be noticed dead is not
        reported; one that answered before and stays silent (hung, stopped) is, once."""
        last = self._last.get(layer)
        if last is None or last[0] != pid:
            return
        seen_pid, since, logged = self._unanswered.get(layer, (pid, now, False))
        if seen_pid != pid:
            since, logged = now, False
        if not logged and now - since >= self._unresponsive_after_s:
            log.error(
                "zerolayer: %s (pid %d) has not answered health checks for %.0f s "
                "(hung or stopped?); its process is alive",
                layer,
                pid,
                now - since,
            )
            logged = True
        self._unanswered[layer] = (pid, since, logged)

    def _channel(self, layer: str) -> grpc.Channel:
        if layer not in self._channels:
            # NOTE: the short reconnect backoff of CHANNEL_OPTIONS, so a restarted layer is seen
            # within a second.
            self._channels[layer] = grpc.insecure_channel(
                self._targets[layer].address, options=CHANNEL_OPTIONS
            )
        return self._channels[layer]

    def _check(self, layer: str) -> int | None:
        request = health_pb2.HealthCheckRequest(service=self._targets[layer].service)
        try:
            stub = health_pb2_grpc.HealthStub(self._channel(layer))
            return stub.Check(request, timeout=0.5).status
        except grpc.RpcError:
            return None

    def close(self) -> None:
        """Closes the channels."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
