"""Structured output in the scheduler: one llguidance matcher per constrained request, compiled
on a thread of its own before the request joins the batch, whose mask of allowed next tokens is
computed on a worker thread while the engine runs the step before.

Pipeline of a constrained request (one matcher, touched by one thread at a time):

- at admission, the compile thread compiles the grammar (:meth:`GrammarBackend.compile`: up to
  seconds for a large grammar) while the request waits outside the batch, so no other request's
  token waits for it (the engine admits it once compiled:
  :meth:`zerolayer.scheduler.core.engine_core.EngineCore.admit_compiled`);
- the request's matcher (and each sample's, n > 1) is a copy of the compiled one, whose first
  mask a mask worker computes;
- before sampling, the engine waits on that mask (it should be ready: it was computed during the
  forward) and the sampler sets the disallowed logits to -inf;
- after sampling, the engine thread consumes the token (:meth:`GrammarMatcher.accept`); at the end
  of the step it hands the next masks of all the step's constrained requests to the workers
  (:meth:`GrammarBackend.prefetch`), which compute them while the engine schedules and runs the
  next forward.

llguidance releases the GIL while it compiles and computes masks. The workers run no torch code
(numpy only): a torch CPU op on another thread would start an OpenMP pool there and slow the
engine's own (see :mod:`zerolayer.scheduler.core.engine`).

Source: llguidance's ``LLMatcher`` (https://github.com/guidance-ai/llguidance, docs/matcher.md).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from llguidance import LLMatcher, LLTokenizer

from zerolayer.common.errors import InvalidArgument, ZerolayerError
from zerolayer.common.generation import StructuredOutput
from zerolayer.common.structured_output import bounded, grammar_of, parser_limits

MASK_WORKERS = 1
"""Threads computing masks. One: a mask takes 10 to 70 us (docs/benchmarks.md), so one thread
keeps up with hundreds of constrained rows per step; it runs while the forward's OpenMP threads
compute and takes a core from them only for those microseconds (their short spin,
:mod:`zerolayer.scheduler.openmp_waiting`, lets it in)."""
COMPILE_WORKERS = 1
"""Threads compiling grammars, apart from the mask workers: a compile that takes seconds delays
only the constrained requests admitted after it, never a mask or a step."""
COMPILE_NICENESS = 10
"""Nice value of the compile thread (the engine's is the process's, usually 0)."""


class GrammarBackend:
    """Builds per-request matchers over the model's tokenizer and owns the mask workers.

    The llguidance tokenizer is built once, on the worker, as soon as the backend exists (4.5 ms
    for a 512-token vocabulary, 0.2 s for 32k, about 1 s for 128k per llguidance's docs), so a
    constrained request does not wait for it unless it comes in the first second of serving.
    """

    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        num_workers: int = MASK_WORKERS,
    ) -> None:
        """Args:
        tokenizer_json: the model's Hugging Face tokenizer.json text.
        vocab_size: width of the logits (masks are this long; ids past the tokenizer's are
            never allowed).
        eos_token_ids: the model's end-of-sequence ids: allowed once the grammar is complete.
        """
        self.vocab_size = vocab_size
        self._tokenizer_json = tokenizer_json
        self._eos_token_ids = list(eos_token_ids)
        self._tokenizer: LLTokenizer | None = None
        self._lock = threading.Lock()
        self._num_workers = num_workers
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="grammar-mask")
        self._compile_pool = ThreadPoolExecutor(
            COMPILE_WORKERS, thread_name_prefix="grammar-compile", initializer=_yield_the_cpu
        )
        # NOTE: a failure here is raised again, to the request, by the next call.
        self._compile_pool.submit(self.tokenizer)
        self.mask_wait_s = 0.0
        """Total seconds the engine waited on masks before sampling (ideally about 0)."""
        self.num_masks = 0
        """Masks the engine applied."""
        self.consume_s = 0.0
        """Total seconds the engine thread spent consuming tokens and handing out masks."""

    def tokenizer(self) -> LLTokenizer:
        """The llguidance tokenizer (built at the first call; thread-safe).

        Raises:
            ValueError: llguidance cannot read the tokenizer.json.
        """
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = LLTokenizer(
                    self._tokenizer_json, n_vocab=self.vocab_size, eos_token=self._eos_token_ids
                )
            return self._tokenizer

    def compile(self, constraint: StructuredOutput, resumed: Sequence[int] = ()) -> Future:
        """Compiles ``constraint`` on the compile thread (llguidance under
        :func:`~zerolayer.common.structured_output.parser_limits`) and consumes ``resumed``
        (output a request generated before a failover, now at the end of its prompt).

        Returns:
            A future of the compiled ``LLMatcher``, never to be advanced itself: each matcher
            (:meth:`matcher`) copies it. Its exception: InvalidArgument
            (``structured_output.<kind>``, a bounded message) for a constraint this tokenizer
            cannot serve (a special token it lacks, a grammar that matches no text), a plain
            ZerolayerError for a resumed token the grammar rejects.
        """
        return self._compile_pool.submit(self._compile, constraint, tuple(resumed))

    def _compile(self, constraint: StructuredOutput, resumed: tuple[int, ...]) -> CompiledGrammar:
        field = f"structured_output.{constraint.kind}"
        # NOTE: log_level 0: llguidance would print its warnings to stderr, the scheduler's log
        grammar = grammar_of(constraint)
        matcher = LLMatcher(self.tokenizer(), grammar, log_level=0, limits=parser_limits())
        # NOTE: some grammars fail only at the first mask (one that matches no text)
        allows_a_token = not matcher.is_error() and any(matcher.compute_bitmask())
        if matcher.is_error():
            raise InvalidArgument(field, f"not servable: {bounded(matcher.get_error())}")
        if not allows_a_token:
            raise InvalidArgument(field, "the grammar allows no token of this vocabulary")
        for token_id in resumed:
            if not matcher.consume_token(token_id):
                raise ZerolayerError(f"structured output: resumed token {token_id} rejected")
        return CompiledGrammar(matcher, field)

    def matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        """A matcher for one request (or sample): a copy of ``compiled`` (:meth:`compile`'s
        result), whose first mask a worker computes."""
        return GrammarMatcher(self, compiled)

    def submit(self, fn, *args) -> Future:  # noqa: ANN001 - a ThreadPoolExecutor.submit
        """Runs ``fn(*args)`` on a mask worker."""
        return self._pool.submit(fn, *args)

    def prefetch(self, matchers: Sequence[GrammarMatcher]) -> None:
        """Starts computing the next mask of each matcher that consumed a token since its last
        one, in one job per worker (not one per matcher: each hand-off wakes a thread, which
        on a busy CPU costs the engine thread more than the mask itself)."""
        pending = [m for m in matchers if m.needs_mask]
        if not pending:
            return
        jobs: list[list[tuple[GrammarMatcher, Future]]] = [[] for _ in range(self._num_workers)]
        for i, matcher in enumerate(pending):
            matcher.needs_mask = False
            matcher._mask = Future()
            jobs[i % self._num_workers].append((matcher, matcher._mask))
        for job in jobs:
            if job:
                self._pool.submit(_compute_masks, job)

    def close(self) -> None:
        """Stops the workers (pending masks and compiles are dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._compile_pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class CompiledGrammar:
    """A constraint compiled for this tokenizer (:meth:`GrammarBackend.compile`)."""

    matcher: LLMatcher
    """In the state to start from; never advanced itself: each request's matcher copies it."""
    field: str
    """The request field it came from (``structured_output.<kind>``), for errors."""


REJECTED_TOKEN = "doesn't satisfy the grammar"
"""How llguidance's error says that a consumed token was not allowed (llguidance 1.x)."""


class GrammarMatcher:
    """One request's grammar state: advances only when a token is appended to its output (so a
    request recomputed after preemption does not consume its tokens twice)."""

    def __init__(self, backend: GrammarBackend, compiled: CompiledGrammar) -> None:
        self._backend = backend
        self.compiled = compiled
        """The compiled grammar this matcher copied (a sample forked from the request copies it
        too)."""
        self._matcher: LLMatcher | None = None
        self.error: ZerolayerError | None = None
        """Why the matcher failed: InvalidArgument (``structured_output.<kind>``) when llguidance
        stopped it (the grammar past its limits at this point of the output, e.g. more than
        ``max_items_in_row`` alternatives open at once: every sampled token was one its mask
        allowed, so the grammar is at fault), a plain ZerolayerError (INTERNAL) for any other
        failure; None while it works."""
        self.is_done = False
        """The grammar is complete and allows nothing more (or the matcher failed): the request
        ends."""
        self.needs_mask = False
        """It consumed a token whose next mask is not asked for yet (:meth:`GrammarBackend.prefetch`
        asks)."""
        self._mask: Future = backend.submit(self._start)

    def _start(self) -> np.ndarray | None:
        self._matcher = self.compiled.matcher.deep_copy()
        return self._compute_mask()

    def _compute_mask(self) -> np.ndarray | None:
        assert self._matcher is not None
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        if self._matcher.is_error():
            raise self._matcher_error()
        return np.unpackbits(bits, count=self._backend.vocab_size, bitorder="little").view(bool)

    def allowed(self) -> np.ndarray | None:
        """The next token's allowed ids: bool [vocab_size]; waits for the worker. None once the
        matcher failed (:attr:`error` says why; the request must end, its token discarded)."""
        if self.needs_mask:
            self._backend.prefetch([self])
        started = time.perf_counter()
        try:
            mask = self._mask.result()
        except ZerolayerError as exc:
            self._fail(exc)
            mask = None
        except Exception as exc:  # noqa: BLE001 - a library error: the request fails
            self._fail(f"{type(exc).__name__}: {exc}")
            mask = None
        if mask is not None and not mask.any():
            self._fail("the grammar allows no token of this vocabulary")
            mask = None
        self._backend.mask_wait_s += time.perf_counter() - started
        self._backend.num_masks += 1
        return mask

    def accept(self, token_id: int) -> None:
        """Consumes the sampled token (engine thread; the next mask is then due:
        :meth:`GrammarBackend.prefetch`); sets :attr:`is_done` when the grammar allows nothing
        more, :attr:`error` when the matcher rejects the token."""
        if self.is_done:
            return
        started = time.perf_counter()
        try:
            self._mask.result()  # NOTE: the worker may not touch the matcher while it consumes
        except Exception as exc:  # noqa: BLE001 - allowed() reports it; never fail the step
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        if self._matcher is None or not self._matcher.consume_token(token_id):
            self._fail(self._matcher_error() if self._matcher else f"token {token_id} rejected")
        elif self._matcher.is_stopped():
            self.is_done = True
        else:
            self.needs_mask = True
        self._backend.consume_s += time.perf_counter() - started

    def _matcher_error(self) -> ZerolayerError:
        """What the failed matcher says, bounded: a rejected token is the engine's fault
        (INTERNAL: it samples from the masks), anything else the grammar's."""
        assert self._matcher is not None
        message = bounded(self._matcher.get_error()) or self._matcher.stop_reason()
        if REJECTED_TOKEN in message:
            return ZerolayerError(f"structured output: {message}")
        return InvalidArgument(self.compiled.field, f"failed while generating: {message}")

    def _fail(self, reason: str | ZerolayerError) -> None:
        if self.error is None:
            failure = ZerolayerError(f"structured output: {reason}")
            self.error = reason if isinstance(reason, ZerolayerError) else failure
        self.is_done = True


def _yield_the_cpu() -> None:
    """Lowers the calling thread's CPU priority (Linux: a thread's nice value is its own) to
    :data:`COMPILE_NICENESS`, so a long compile takes the cores the engine leaves idle rather
    than delaying its steps where cores are few; a system that refuses leaves it as it was."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)


def _compute_masks(job: list[tuple[GrammarMatcher, Future]]) -> None:
    for matcher, future in job:
        try:
            future.set_result(matcher._compute_mask())
        except Exception as exc:  # noqa: BLE001 - handed to the engine thread by allowed()
            future.set_exception(exc)


def allowed_tokens(
    matchers: Sequence[GrammarMatcher | None], vocab_size: int
) -> torch.Tensor | None:
    """The batch's allowed-token mask for the sampler.

    Args:
        matchers: one per sampled row; None for an unconstrained row.

    Returns:
        bool [B, vocab_size] (True: allowed; all True for unconstrained rows and for rows whose
        matcher failed, which end without their token); None when no row is constrained.
    """
    if all(m is None for m in matchers):
        return None
    allowed = np.ones((len(matchers), vocab_size), dtype=bool)
    for row, matcher in enumerate(matchers):
        mask = None if matcher is None else matcher.allowed()
        if mask is not None:
            allowed[row] = mask
    return torch.from_numpy(allowed)
