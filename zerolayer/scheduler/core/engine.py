"""The engine loop: a dedicated thread that schedules, runs the model and samples, step by step.

Requests and aborts arrive from gRPC handlers on other threads as commands
(:mod:`zerolayer.scheduler.core.engine_commands`) through a queue, which the loop drains at the
start of each step, so the scheduler itself is only ever touched by this thread.

NOTE: torch's CPU kernels run on OpenMP, and libgomp keeps one worker pool per thread that ever
started a parallel region; idle pools stay alive with their thread. When the pools' threads
outnumber the cores, libgomp stops spinning between regions and parks its workers on a futex, so
each of the ~85 parallel regions of a decode step pays a wake-up (measured here: 7.7 ms steps
become 12-13 ms at batch 1 on 2 cores). So every torch computation of the scheduler process runs
on the engine thread (warm-up included, see :meth:`Engine.start`) or on a thread that exits
afterwards (:func:`call_in_fresh_thread`, which frees its pool), never on the asyncio thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import EngineRequest
from zerolayer.scheduler.core import engine_commands as commands
from zerolayer.scheduler.core.engine_commands import EngineCommand, Sink
from zerolayer.scheduler.core.engine_core import EngineCore, EngineStats
from zerolayer.scheduler.core.kv_cache_manager import ArenaChanged
from zerolayer.scheduler.core.scheduler import Scheduler
from zerolayer.scheduler.core.trace import RequestTraceHooks
from zerolayer.scheduler.metrics import SchedulerMetrics
from zerolayer.scheduler.model.model_runner import ModelRunner
from zerolayer.scheduler.model.sampler import Sampler
from zerolayer.scheduler.model.structured_output import GrammarBackend

# NOTE: EngineStats is part of the engine's public face (what stats() returns; the conversion
# module imports it from here), though it is defined beside EngineCore.
__all__ = ["Engine", "EngineStats", "call_in_fresh_thread"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Engine(EngineCore):
    """The :class:`EngineCore` driven by its own thread, with a thread-safe command queue."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        sampler: Sampler,
        metrics: SchedulerMetrics | None = None,
        grammar: GrammarBackend | None = None,
    ) -> None:
        super().__init__(scheduler, runner, sampler, metrics, grammar)
        self._commands: queue.SimpleQueue[EngineCommand] = queue.SimpleQueue()
        self.compiling.on_compiled = lambda: self.send(commands.Wake())
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._ready = threading.Event()
        self._warm_up_tokens = 0
        self._warm_up_s = 0.0
        self._start_error: BaseException | None = None

    def start(self, warm_up_tokens: int = 0) -> float:
        """Starts the engine thread; with ``warm_up_tokens`` > 0 the thread first runs
        :meth:`warm_up` with that prompt length, then :meth:`capture_graphs`, and this call
        blocks until they are done (run it off the event loop: ``asyncio.to_thread``).

        Returns:
            Seconds the warm-up and the capture took (0.0 without a warm-up).

        Raises:
            Exception: whatever the warm-up raised (the engine thread has then exited).
        """
        self._warm_up_tokens = warm_up_tokens
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error
        return self._warm_up_s

    def _run(self) -> None:
        try:
            if self._warm_up_tokens > 0:
                self._warm_up_s = self.warm_up(self._warm_up_tokens)
                self._warm_up_s += self.capture_graphs()
        except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
            self._start_error = exc
            return
        finally:
            self._ready.set()
        self._loop()

    def stop(self) -> None:
        """Stops the thread after its current step."""
        self._stopped.set()
        self.send(commands.Wake())
        self._thread.join(timeout=10)
        if self.grammar is not None:
            self.grammar.close()

    @property
    def is_running(self) -> bool:
        """Whether the engine thread is alive (started and neither stopped nor failed to start)."""
        return self._thread.is_alive()

    def send(self, command: EngineCommand) -> None:
        """Queues a command for the next step boundary; thread-safe. :meth:`submit`,
        :meth:`abort`, :meth:`fail` and :meth:`annotate` send theirs.

        Raises:
            TypeError: ``command`` is not an :data:`EngineCommand` (nothing is queued).
        """
        if not isinstance(command, EngineCommand):
            raise TypeError(f"not an engine command: {command!r}")
        self._commands.put(command)

    def submit(
        self, request: EngineRequest, sink: Sink, trace: RequestTraceHooks | None = None
    ) -> None:
        """Queues a request; thread-safe. Errors (e.g. InvalidArgument, or :attr:`fault` once the
        engine failed) arrive through ``sink``.

        Args:
            trace: records the request's spans (a RequestTrace), or None.
        """
        if self.fault is not None:
            sink(self.fault)
            flush = getattr(sink, "flush", None)
            if flush is not None:
                flush()
            return
        self.send(commands.AddRequest(request, sink, trace))

    def abort(self, request_id: str) -> None:
        """Aborts a request and frees its blocks at the next step boundary; thread-safe."""
        self.send(commands.AbortRequest(request_id))

    def abort_sample(self, request_id: str, index: int) -> None:
        """Ends sample ``index`` of a request with n > 1 and frees its blocks at the next step
        boundary (its stream gets the sample's ABORT output); thread-safe."""
        self.send(commands.AbortSample(request_id, index))

    def fail(self, error: Unavailable) -> None:
        """Stops serving for good (e.g. a fatal GPU event); thread-safe. From now on new requests
        get ``error``; at the next step boundary (within one step) every request in flight gets
        it too and is aborted, which frees its KV blocks."""
        self.fault = error
        self.send(commands.FailAll(error))

    def annotate(self, name: str, attributes: Mapping[str, str | int]) -> None:
        """Adds a span event to the server span of every request in flight at the next step
        boundary; thread-safe. Requests without a trace are skipped."""
        self.send(commands.Annotate(name, attributes))

    def process_commands(self) -> None:
        """Applies every queued command now, in order. Call on the thread that steps: the engine
        thread does at each step boundary; a caller that drives :meth:`step` itself (tests, a
        single-threaded driver) does before each step."""
        self._drain(block=False)

    def _drain(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        try:
            while True:
                self.apply(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    return
        finally:
            self.flush_deliveries()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._drain(block=not self.scheduler.has_unfinished_requests)
            if not self.scheduler.has_unfinished_requests:
                self.note_idle()
                continue
            try:
                self.step()
            except ArenaChanged as exc:
                log.error("%s; failing in-flight requests and mapping the new arena", exc)
                self.apply(commands.FailAll(_step_failed(exc)))
                self.runner.set_arena(exc.arena)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - keep serving; fail what was in flight
                log.exception("engine step failed")
                # NOTE: after a fatal GPU event a step may fail on the dead device: the requests
                # then get the event's message, not the CUDA error it caused.
                self.apply(commands.FailAll(self.fault or _step_failed(exc)))


def _step_failed(exc: Exception) -> Unavailable:
    return Unavailable(f"engine step failed: {type(exc).__name__}: {exc}")


def call_in_fresh_thread(fn: Callable[..., T], *args: object) -> T:
    """Runs ``fn(*args)`` on a new thread that exits afterwards, and returns its result.

    For torch work off the engine thread (building the model): the OpenMP pool such work creates
    dies with the thread instead of idling beside the engine's (see the module note).

    Raises:
        BaseException: whatever ``fn`` raised.
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="engine-build")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
