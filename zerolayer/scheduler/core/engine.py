"""The engine loop: a dedicated thread that schedules, runs the model and samples, step by step.

Requests and aborts arrive from gRPC handlers on other threads through a command queue, which the
loop drains at the start of each step, so the scheduler itself is only ever touched by this thread.

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
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from zerolayer.common.config import WARM_UP_MAX_NEW_TOKENS, WARM_UP_PROMPT_TOKENS
from zerolayer.common.errors import Unavailable, ZerolayerError
from zerolayer.common.generation import EngineRequest, RequestOutput, SamplingParams
from zerolayer.scheduler.core.kv_cache_manager import ArenaChanged
from zerolayer.scheduler.core.scheduler import Scheduler
from zerolayer.scheduler.core.trace import RequestTraceHooks
from zerolayer.scheduler.metrics import SchedulerMetrics
from zerolayer.scheduler.model.model_runner import ModelRunner
from zerolayer.scheduler.model.sampler import Sampler

log = logging.getLogger(__name__)

T = TypeVar("T")

Sink = Callable[[RequestOutput | Exception], None]
"""Receives a request's outputs (or the error that ended it); called on the engine thread."""


@dataclass(frozen=True)
class EngineStats:
    """Counters read by the stats RPC."""

    num_running: int
    num_waiting: int
    num_blocks_held: int
    num_preemptions: int
    num_steps: int
    attention_backend: str
    """"triton", "native" or "reference" (:attr:`ModelRunner.attention_backend`)."""
    num_cuda_graphs: int


class Engine:
    """Owns the scheduler, the model runner and the sampler, and drives them on one thread."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        sampler: Sampler,
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.metrics = metrics
        self._last_step_end: float | None = None
        self._num_preemptions_seen = 0
        self.runner = runner
        self.sampler = sampler
        self.num_steps = 0
        self._commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._ready = threading.Event()
        self._warm_up_tokens = 0
        self._warm_up_s = 0.0
        self._start_error: BaseException | None = None
        self.fault: Unavailable | None = None
        """The error every request gets once the GPU failed (:meth:`fail`); None while serving."""

    def warm_up(self, num_prompt_tokens: int = WARM_UP_PROMPT_TOKENS) -> float:
        """Runs one short request through prefill and decode before serving (first-call costs:
        kernel selection, allocator growth, page faults on the weights). Call before
        :meth:`start`. Its blocks are freed (its content cached under a private salt, which no
        client request can match).

        Returns:
            Seconds taken.
        """
        started = time.perf_counter()
        prompt = tuple(3 + i % 200 for i in range(num_prompt_tokens))
        self.scheduler.add_request(
            EngineRequest(
                "zerolayer-warm-up",
                prompt,
                WARM_UP_MAX_NEW_TOKENS,
                SamplingParams(),
                ignore_eos=True,
                cache_salt="\x00zerolayer-warm-up",
            )
        )
        while self.scheduler.has_unfinished_requests:
            self.step()
        return time.perf_counter() - started

    def capture_graphs(self) -> float:
        """Captures the model runner's decode CUDA graphs (a no-op on the CPU); call on the thread
        that steps, after :meth:`warm_up` and before serving (see
        :meth:`ModelRunner.capture_graphs`).

        Returns:
            Seconds taken.
        """
        started = time.perf_counter()
        num_graphs = self.runner.capture_graphs()
        elapsed = time.perf_counter() - started
        if num_graphs:
            log.info("captured %d decode CUDA graphs in %.0f ms", num_graphs, elapsed * 1e3)
        return elapsed

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
        self._commands.put(("wake",))
        self._thread.join(timeout=10)

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
            return
        self._commands.put(("add", request, sink, trace))

    def fail(self, error: Unavailable) -> None:
        """Stops serving for good (e.g. a fatal GPU event); thread-safe. From now on new requests
        get ``error``; at the next step boundary (within one step) every request in flight gets
        it too and is aborted, which frees its KV blocks."""
        self.fault = error
        self._commands.put(("fail", error))

    def annotate(self, name: str, attributes: dict[str, str | int]) -> None:
        """Adds a span event to the server span of every request in flight at the next step
        boundary; thread-safe. Requests without a trace are skipped."""
        self._commands.put(("annotate", name, attributes))

    @property
    def not_serving_reason(self) -> str:
        """Why the engine stopped serving; empty while it serves."""
        return "" if self.fault is None else str(self.fault)

    def abort(self, request_id: str) -> None:
        """Aborts a request and frees its blocks at the next step boundary; thread-safe."""
        self._commands.put(("abort", request_id))

    def stats(self) -> EngineStats:
        """A snapshot of the counters (approximate while the loop runs)."""
        s = self.scheduler
        return EngineStats(
            len(s.running),
            len(s.waiting),
            s.kv.num_blocks_held,
            s.num_preemptions,
            self.num_steps,
            self.runner.attention_backend,
            self.runner.num_cuda_graphs,
        )

    def _drain(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, command: tuple) -> None:
        if command[0] == "add":
            _, request, sink, trace = command
            if self.fault is not None:
                sink(self.fault)
                return
            try:
                self.scheduler.add_request(request, trace)
            except ZerolayerError as exc:
                sink(exc)
                return
            self._sinks[request.request_id] = sink
        elif command[0] == "abort":
            self._sinks.pop(command[1], None)
            self.scheduler.abort_request(command[1])
        elif command[0] == "fail":
            self._fail_all(command[1])
        elif command[0] == "annotate":
            for request in self.scheduler.requests.values():
                if request.trace is not None:
                    request.trace.add_event(command[1], command[2])

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._drain(block=not self.scheduler.has_unfinished_requests)
            if not self.scheduler.has_unfinished_requests:
                self._last_step_end = None  # idle time is not a scheduling gap
                continue
            try:
                self.step()
            except ArenaChanged as exc:
                log.error("%s; failing in-flight requests and mapping the new arena", exc)
                self._fail_all(_step_failed(exc))
                self.runner.set_arena(exc.arena)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - keep serving; fail what was in flight
                log.exception("engine step failed")
                # NOTE: after a fatal GPU event a step may fail on the dead device: the requests
                # then get the event's message, not the CUDA error it caused.
                self._fail_all(self.fault or _step_failed(exc))

    def step(self) -> None:
        """Runs one schedule -> forward -> sample -> update cycle and delivers the outputs."""
        start = time.perf_counter()
        if self.metrics is not None and self._last_step_end is not None:
            self.metrics.step_gap.observe((start - self._last_step_end) * 1e6)
        output = self.scheduler.schedule()
        for request_id, error in output.failed.items():
            sink = self._sinks.pop(request_id, None)
            if sink is not None:
                sink(error)
        if not output.scheduled:
            self._last_step_end = None
            time.sleep(0.001)
            return
        logits = self.runner.execute(output)
        sampling = [s.request for s in output.scheduled if s.samples]
        token_ids = self.sampler(
            logits, [r.sampling for r in sampling], [r.generator for r in sampling]
        )
        self.num_steps += 1
        results = self.scheduler.update(output, token_ids)
        if self.metrics is not None:
            self._observe(sampling)
        self._last_step_end = time.perf_counter()
        for result in results:
            sink = self._sinks.get(result.request_id)
            if sink is not None:
                sink(result)
            if result.finished:
                self._sinks.pop(result.request_id, None)

    def _observe(self, sampled: list) -> None:
        now = time.monotonic()
        metrics = self.metrics
        for request in sampled:
            first = request.last_token_time is None
            if first:
                metrics.on_admitted(
                    (request.admitted_time or now) - request.arrival_time,
                    request.num_prompt_tokens,
                    request.num_cached_tokens,
                )
            metrics.on_token(
                first, now - request.arrival_time, now - (request.last_token_time or now)
            )
            request.last_token_time = now
            if request.is_finished:
                metrics.e2e.observe(now - request.arrival_time)
        new_preemptions = self.scheduler.num_preemptions - self._num_preemptions_seen
        if new_preemptions:
            metrics.preemptions.inc(new_preemptions)
            self._num_preemptions_seen = self.scheduler.num_preemptions

    def _fail_all(self, error: Unavailable) -> None:
        """Ends every request in flight with ``error`` and aborts it (frees its blocks)."""
        for request_id in list(self.scheduler.requests):
            sink = self._sinks.pop(request_id, None)
            if sink is not None:
                sink(error)
            try:
                self.scheduler.abort_request(request_id)
            except Exception:  # noqa: BLE001 - the kvstore may be what failed: recount later
                self.scheduler.requests.pop(request_id, None)
                self.scheduler.kv.needs_reconcile = True
        self.scheduler.running.clear()
        self.scheduler.waiting.clear()


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
