"""What other threads ask of the engine: commands queued to the engine thread, which applies them
at the next step boundary (:meth:`zerolayer.scheduler.core.engine.Engine.process_commands`), so
the scheduler is only ever touched by that thread."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import EngineRequest, RequestOutput
from zerolayer.scheduler.core.trace import RequestTraceHooks

Sink = Callable[[RequestOutput | Exception], None]
"""Receives a request's outputs (or the error that ended it); called on the engine thread. A sink
with a ``flush()`` method (a :class:`BatchedSink`) may hold its outputs until the engine calls it,
which it does once after each step and each drain of its commands, whatever number of sinks
share one ``flush``."""


class BatchedSink(Protocol):
    """A :data:`Sink` that hands its outputs on only when flushed."""

    def __call__(self, item: RequestOutput | Exception) -> None: ...

    flush: Callable[[], None]


@dataclass(frozen=True)
class AddRequest:
    """Queue ``request``; its outputs, or the error that ends it (e.g. InvalidArgument, or the
    engine's fault), go to ``sink``."""

    request: EngineRequest
    sink: Sink
    trace: RequestTraceHooks | None = None
    """Records the request's spans; None: untraced."""


@dataclass(frozen=True)
class AbortRequest:
    """End the request now and free its KV blocks; its sink gets nothing more. An unknown (e.g.
    already finished) request_id changes nothing."""

    request_id: str


@dataclass(frozen=True)
class AbortSample:
    """End sample ``index`` of the request (n > 1) now and free its blocks; its sink gets the
    sample's last output (ABORT). Unknown, or already finished: nothing changes."""

    request_id: str
    index: int


@dataclass(frozen=True)
class FailAll:
    """End every request in flight with ``error`` (each sink gets it once) and abort it, which
    frees its KV blocks."""

    error: Unavailable


@dataclass(frozen=True)
class Annotate:
    """Add the event ``name`` with ``attributes`` to the trace of every request in flight
    (untraced requests are skipped)."""

    name: str
    attributes: Mapping[str, str | int]


@dataclass(frozen=True)
class Wake:
    """Changes nothing: ends the engine thread's wait on an empty queue (so it sees a stop)."""


EngineCommand = AddRequest | AbortRequest | AbortSample | FailAll | Annotate | Wake
"""Every command the engine applies."""
