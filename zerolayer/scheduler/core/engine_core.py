"""One engine step at a time: schedule, run the model, sample, update, deliver; and the commands
that change what is in flight (:mod:`zerolayer.scheduler.core.engine_commands`).

Not thread-safe: one thread drives it, the engine thread of
:class:`zerolayer.scheduler.core.engine.Engine` (or a test that steps it itself).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zerolayer.common.config import WARM_UP_MAX_NEW_TOKENS, WARM_UP_PROMPT_TOKENS
from zerolayer.common.errors import InvalidArgument, Unavailable, ZerolayerError
from zerolayer.common.generation import (
    EngineRequest,
    PositionLogprobs,
    RequestOutput,
    SamplingParams,
)
from zerolayer.scheduler.core.compiling import CompilingRequests
from zerolayer.scheduler.core.engine_commands import (
    AbortRequest,
    AbortSample,
    AddRequest,
    Annotate,
    EngineCommand,
    FailAll,
    Sink,
    Wake,
)
from zerolayer.scheduler.core.request import Request
from zerolayer.scheduler.core.scheduler import Scheduler
from zerolayer.scheduler.core.scheduler_output import SchedulerOutput
from zerolayer.scheduler.metrics import SchedulerMetrics
from zerolayer.scheduler.model.logits_processors import apply_logits_processors
from zerolayer.scheduler.model.logprobs import (
    record_prompt_logprobs,
    sampled_logprobs,
    with_logprobs,
)
from zerolayer.scheduler.model.model_runner import ModelRunner
from zerolayer.scheduler.model.sampler import Sampler
from zerolayer.scheduler.model.structured_output import (
    CompiledGrammar,
    GrammarBackend,
    allowed_tokens,
)

log = logging.getLogger(__name__)


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


class EngineCore:
    """Owns the scheduler, the model runner, the sampler and the sinks of the requests in flight,
    and steps them."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        sampler: Sampler,
        metrics: SchedulerMetrics | None = None,
        grammar: GrammarBackend | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.grammar = grammar
        """Matchers of structured-output requests; None: such requests are refused."""
        self.runner = runner
        self.sampler = sampler
        self.metrics = metrics
        """Where the steps and the sequences that end are recorded; None: nowhere (also while
        :meth:`warm_up` runs, which is not traffic)."""
        scheduler.on_finished = self._on_finished
        self.num_steps = 0
        self._last_step_end: float | None = None
        self._sinks: dict[str, Sink] = {}
        self.compiling = CompilingRequests(lambda: None)
        """Constrained requests whose grammar compiles, not in the scheduler yet; its
        ``on_compiled`` is called on the compile thread when one is done (the :class:`Engine`
        wakes its thread, which then admits the request: :meth:`admit_compiled`)."""
        self._unflushed: set[Callable[[], None]] = set()
        self.fault: Unavailable | None = None
        """The error every request gets once the GPU failed (:meth:`Engine.fail`); None while
        serving."""

    @property
    def not_serving_reason(self) -> str:
        """Why the engine stopped serving; empty while it serves."""
        return "" if self.fault is None else str(self.fault)

    @property
    def has_unfinished_requests(self) -> bool:
        """Requests in the scheduler, or compiling their grammar before they join it."""
        return self.scheduler.has_unfinished_requests or bool(self.compiling)

    @property
    def num_streams(self) -> int:
        """Requests whose outputs the engine still delivers (added, not yet finished, aborted or
        failed)."""
        return len(self._sinks)

    def stats(self) -> EngineStats:
        """A snapshot of the counters (approximate while the loop runs)."""
        s = self.scheduler
        return EngineStats(
            s.num_running,
            s.num_waiting,
            s.kv.num_blocks_held,
            s.num_preemptions,
            self.num_steps,
            self.runner.attention_backend,
            self.runner.num_cuda_graphs,
        )

    def apply(self, command: EngineCommand) -> None:
        """Applies one command now (on the thread that steps; other threads queue commands with
        :meth:`Engine.send`). What each does is on its class.

        Raises:
            TypeError: ``command`` is not an :data:`EngineCommand`.
        """
        match command:
            case AddRequest():
                self._add(command)
            case AbortRequest(request_id=request_id):
                self._sinks.pop(request_id, None)
                self.compiling.discard(request_id)
                self.scheduler.abort_request(request_id)
            case AbortSample(request_id=request_id, index=index):
                self._abort_sample(request_id, index)
            case FailAll(error=error):
                self._fail_all(error)
            case Annotate(name=name, attributes=attributes):
                self.scheduler.annotate(name, attributes)
            case Wake():
                self.admit_compiled()
            case _:
                raise TypeError(f"not an engine command: {command!r}")

    def _add(self, command: AddRequest) -> None:
        if self.fault is not None:
            self._deliver(command.sink, self.fault)
            return
        request = command.request
        if request.structured_output is None:
            self._admit(command, None)
            return
        if self.grammar is None:
            error = InvalidArgument("structured_output", "this scheduler has no tokenizer")
            self._deliver(command.sink, error)
            return
        if request.request_id in self._sinks:
            error = InvalidArgument("request_id", f"{request.request_id!r} is in flight")
            self._deliver(command.sink, error)
            return
        self.compiling.add(command, self.grammar)
        self._sinks[request.request_id] = command.sink

    def admit_compiled(self) -> None:
        """Moves the requests whose grammar compiled into the scheduler (each with its matcher),
        and ends those whose grammar failed with the error (one INFO line); the others keep
        compiling. Called on the thread that steps: at each :class:`Wake` and before each
        step."""
        for command, compiled in self.compiling.done():
            if isinstance(compiled, ZerolayerError):
                log.info("request %s: refused: %s", command.request.request_id, compiled)
                self._sinks.pop(command.request.request_id, None)
                self._deliver(command.sink, compiled)
            else:
                self._admit(command, compiled)

    def _admit(self, command: AddRequest, compiled: CompiledGrammar | None) -> None:
        """Adds the request to the scheduler, with a matcher copied from ``compiled`` (None:
        unconstrained); an error the scheduler raises goes to its sink."""
        try:
            request = self.scheduler.add_request(command.request, command.trace)
        except ZerolayerError as exc:
            self._sinks.pop(command.request.request_id, None)
            self._deliver(command.sink, exc)
            return
        if compiled is not None and self.grammar is not None:
            request.grammar = self.grammar.matcher(compiled)
        self._sinks[command.request.request_id] = command.sink

    def _abort_sample(self, request_id: str, index: int) -> None:
        """Ends one sample and delivers its last output (the stream ends with the last one)."""
        result = self.scheduler.abort_sample(request_id, index)
        if result is None:
            return
        sink = self._sinks.get(request_id)
        if sink is not None:
            self._deliver(sink, result)
        if request_id not in self.scheduler.requests:
            self._sinks.pop(request_id, None)

    def _fail_all(self, error: Unavailable) -> None:
        """Aborts every request in flight (frees its blocks) and ends it with ``error``."""
        compiling = self.compiling.clear()
        for request_id in [*compiling, *self.scheduler.abort_all_requests()]:
            sink = self._sinks.pop(request_id, None)
            if sink is not None:
                self._deliver(sink, error)

    def _on_finished(self, request: Request) -> None:
        if self.metrics is not None:
            self.metrics.on_finished(request)

    def warm_up(self, num_prompt_tokens: int = WARM_UP_PROMPT_TOKENS) -> float:
        """Runs one short request through prefill and decode before serving (first-call costs:
        kernel selection, allocator growth, page faults on the weights). Call before
        :meth:`Engine.start`. Its blocks are freed (its content cached under a private salt,
        which no client request can match). It is not traffic: :attr:`metrics` records none of
        it, nor do the kvstore's prefix-cache counters.

        Returns:
            Seconds taken.
        """
        started = time.perf_counter()
        # NOTE: a model with a context (or sliding-window cap) shorter than the warm-up prompt
        # warms up on a shorter one, and ids stay inside a small vocabulary.
        num_prompt_tokens = max(1, min(num_prompt_tokens, self.scheduler.policy.max_model_len - 1))
        vocab_size = self.runner.model.config.vocab_size
        prompt = tuple(min(3 + i % 200, vocab_size - 1) for i in range(num_prompt_tokens))
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
        metrics, self.metrics = self.metrics, None
        self.scheduler.kv.count_lookups = False  # nor do the kvstore's prefix-cache counters
        try:
            while self.scheduler.has_unfinished_requests:
                self.step()
        finally:
            self.scheduler.kv.count_lookups = True
            self.metrics = metrics
            self._last_step_end = None
            if metrics is not None:
                metrics.skip_preemptions(self.scheduler.num_preemptions)
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

    def _fail_grammar_errors(
        self, sampling: list[Request], results: list[RequestOutput]
    ) -> list[RequestOutput]:
        """Ends the requests whose structured-output matcher failed with its error
        (:attr:`GrammarMatcher.error`) instead of their (unconstrained) token; returns the other
        results."""
        errors = {r.request_id: r.grammar.error for r in sampling if r.grammar and r.grammar.error}
        if not errors:
            return results
        for request_id, error in errors.items():
            # NOTE: a grammar at fault (InvalidArgument) is the client's event, not the server's
            level = logging.INFO if isinstance(error, InvalidArgument) else logging.WARNING
            log.log(level, "request %s: %s", request_id, error)
            sink = self._sinks.pop(request_id, None)
            if sink is not None:
                self._deliver(sink, error)
        return [r for r in results if r.request_id not in errors]

    def _deliver(self, sink: Sink, item: RequestOutput | Exception) -> None:
        sink(item)
        flush = getattr(sink, "flush", None)
        if flush is not None:
            self._unflushed.add(flush)

    def flush_deliveries(self) -> None:
        """Calls ``flush`` of each batched sink (:class:`BatchedSink`) that got outputs since the
        last call, once per distinct ``flush``; the engine calls it after each step and each
        drain of its commands.

        Raises:
            Exception: whatever a ``flush`` raised (the others stay pending).
        """
        while self._unflushed:
            self._unflushed.pop()()

    def note_idle(self) -> None:
        """Nothing is in flight: the time until the next step is not a scheduling gap."""
        self._last_step_end = None

    def step(self) -> None:
        """Admits the requests whose grammar compiled (waiting for one when nothing else is in
        flight), then runs one schedule -> forward -> sample -> update cycle and delivers the
        outputs (batched sinks are flushed at its end, even when it raises)."""
        try:
            if not self.scheduler.has_unfinished_requests:
                # NOTE: a driver that steps by itself, with only compiles in flight; the engine
                # thread steps only when the scheduler has requests
                self.compiling.wait(1.0)
            self.admit_compiled()
            self._step()
        finally:
            self.flush_deliveries()

    def _step(self) -> None:
        start = time.perf_counter()
        if self.metrics is not None and self._last_step_end is not None:
            self.metrics.step_gap.observe(start - self._last_step_end)
        output = self.scheduler.schedule()
        for request_id, error in output.failed.items():
            sink = self._sinks.pop(request_id, None)
            if sink is not None:
                self._deliver(sink, error)
        if not output.scheduled:
            self._last_step_end = None
            time.sleep(0.001)
            return
        if any(s.request.needs_prompt_logprobs for s in output.scheduled):
            prompt_logprobs: dict[str, list[PositionLogprobs]] = {}
            logits = self.runner.execute(output, prompt_logprobs)
            record_prompt_logprobs(output, prompt_logprobs)
        else:
            logits = self.runner.execute(output)
        logits = self._fork_samples(output, logits)
        sampling = [s.request for s in output.scheduled if s.samples]
        processed = apply_logits_processors(logits, sampling, self.scheduler.eos_token_ids)
        allowed = allowed_tokens([r.grammar for r in sampling], logits.shape[-1])
        token_ids = self.sampler(
            processed,
            [r.sampling for r in sampling],
            [r.seed for r in sampling],
            [r.num_tokens for r in sampling],
            allowed=allowed,
        )
        self.num_steps += 1
        sampled = sampled_logprobs(logits, sampling, token_ids)
        results = self.scheduler.update(output, token_ids)
        results = with_logprobs(results, sampling, sampled)
        results = self._fail_grammar_errors(sampling, results)
        if self.grammar is not None:
            self.grammar.prefetch([r.grammar for r in sampling if r.grammar is not None])
        if self.metrics is not None:
            self.metrics.on_step(sampling, self.scheduler.num_preemptions)
        self._last_step_end = time.perf_counter()
        for result in results:
            sink = self._sinks.get(result.request_id)
            if sink is not None:
                self._deliver(sink, result)
        for result in results:
            # A request with n > 1 ends with its last sample.
            if result.finished and result.request_id not in self.scheduler.requests:
                self._sinks.pop(result.request_id, None)

    def _fork_samples(self, output: SchedulerOutput, logits: torch.Tensor) -> torch.Tensor:
        """Forks the requests with n > 1 whose prompt this step completed
        (:meth:`Scheduler.fork_samples`): copies the KV blocks the new samples need and returns
        ``logits`` with, appended, their sample 0's row for each (their first token is drawn
        from it with their own seed)."""
        fork = self.scheduler.fork_samples(output)
        for sample in fork.samples:
            parent = self.scheduler.requests[sample.request_id].grammar
            if parent is not None and self.grammar is not None:
                # each sample follows the grammar on its own, from the request's compiled one
                sample.grammar = self.grammar.matcher(parent.compiled)
        if fork.block_copies:
            self.runner.copy_blocks(fork.block_copies)
        if not fork.parent_rows:
            return logits
        rows = torch.tensor(fork.parent_rows, device=logits.device)
        return torch.cat([logits, logits.index_select(0, rows)])
