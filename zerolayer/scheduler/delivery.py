"""Outputs from the engine thread to the gRPC event loop, one wake-up of the loop per step.

Each ``loop.call_soon_threadsafe`` writes to the loop's self-pipe and wakes it; one per output
meant a batch of 16 decoding requests woke the loop 16 times a step. A :class:`LoopDelivery`'s
sinks only queue their outputs; the engine calls their ``flush`` once after a step (or a drain of
its commands), which hands everything queued to the loop with a single callback.
"""

from __future__ import annotations

import asyncio
import threading

from zerolayer.common.generation import RequestOutput

Item = RequestOutput | Exception


class LoopDelivery:
    """Hands outputs to ``asyncio.Queue`` s of one event loop in batches; thread-safe."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue[Item], Item]] = []
        self._scheduled = False

    def sink(self, queue: asyncio.Queue[Item]) -> QueueSink:
        """A batched sink (see :class:`zerolayer.scheduler.core.engine_commands.BatchedSink`)
        whose items arrive in ``queue`` after the next :meth:`flush`."""
        return QueueSink(self, queue)

    def put(self, queue: asyncio.Queue[Item], item: Item) -> None:
        """Queues ``item`` for ``queue`` until the next :meth:`flush` (any thread)."""
        with self._lock:
            self._items.append((queue, item))

    def flush(self) -> None:
        """Hands what is queued to the loop with one callback, unless one is already pending
        (which will take it too); nothing queued: nothing happens.

        Raises:
            RuntimeError: the loop is closed.
        """
        with self._lock:
            if not self._items or self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for queue, item in items:
            queue.put_nowait(item)


class QueueSink:
    """One request's sink of a :class:`LoopDelivery`: calling it queues an output for the
    request's ``asyncio.Queue``; ``flush`` (the delivery's, the same for all its sinks, so the
    engine calls it once per step) hands them over."""

    def __init__(self, delivery: LoopDelivery, queue: asyncio.Queue[Item]) -> None:
        self._delivery = delivery
        self._queue = queue
        self.flush = delivery.flush

    def __call__(self, item: Item) -> None:
        self._delivery.put(self._queue, item)
