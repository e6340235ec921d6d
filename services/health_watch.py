"""The supervisor's view of layers that are alive but stop serving (e.g. a scheduler whose GPU had
a fatal error): it polls each layer's ``grpc.health.v1`` status and logs the change, with the
reason the layer gives (the scheduler's ``GetStats.not_serving_reason``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.server import CHANNEL_OPTIONS
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass(frozen=True)
class HealthTarget:
    """Where a layer reports its health."""

    address: str
    service: str = ""
    """Health service name to ask for ("" = the whole server)."""


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
"""Per layer, how to ask it why it stopped serving."""


class HealthWatch:
    """Polls the health of running layers (at most every ``interval_s``) and logs when one that
    was SERVING reports NOT_SERVING while its process lives on, and when it serves again.

    A new process (a restart) starts a new history, so its start-up is never reported. Not
    thread-safe: the supervisor thread calls :meth:`poll`.
    """

    def __init__(self, targets: Mapping[str, HealthTarget], interval_s: float = 0.5) -> None:
        self._targets = dict(targets)
        self._interval_s = interval_s
        self._channels: dict[str, grpc.Channel] = {}
        self._last: dict[str, tuple[int, int]] = {}
        """layer -> (pid, last status seen)."""
        self._next_poll = 0.0

    def poll(self, pids: Mapping[str, int]) -> None:
        """Checks each layer in ``pids`` (layer -> pid of its live process) if the interval has
        passed; logs changes."""
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + self._interval_s
        for layer, pid in pids.items():
            status = self._check(layer)
            if status is None:
                continue  # unreachable: starting, or about to be noticed dead
            previous = self._last.get(layer)
            self._last[layer] = (pid, status)
            if previous is None or previous[0] != pid or previous[1] == status:
                continue
            if status == SERVING:
                log.warning("zerolayer: %s is serving again", layer)
            else:
                reason = REASONS[layer](self._channel(layer)) if layer in REASONS else ""
                log.error(
                    "zerolayer: %s (pid %d) stopped serving: %s",
                    layer,
                    pid,
                    reason or "it gives no reason",
                )

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
