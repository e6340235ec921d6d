"""Engine commands: each does exactly its thing when applied, the thread-safe methods queue the
right one, and anything that is not a command is refused."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextlib import nullcontext

import pytest
from factories import make_engine_request, make_engine_without_model

from zerolayer.common.errors import InvalidArgument, Unavailable
from zerolayer.common.generation import RequestOutput
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.core.engine_commands import (
    AbortRequest,
    AddRequest,
    Annotate,
    FailAll,
    Wake,
)

BLOCK_SIZE = 4
NUM_BLOCKS = 16
ERROR = Unavailable("GPU fatal event: Xid 79")


class Outputs(list):
    """A sink: the outputs and errors it received, in order."""

    def __call__(self, item: RequestOutput | Exception) -> None:
        self.append(item)


class EventTrace:
    """A trace that records its events (requests that are never scheduled need no other hook)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def add_event(self, name: str, attributes: Mapping[str, str | int]) -> None:
        self.events.append((name, dict(attributes)))


unstarted_engine = functools.partial(
    make_engine_without_model, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, max_num_seqs=4
)
"""An engine (not started, never stepped: no runner) over a fresh in-process pool."""
six_token_request = functools.partial(
    make_engine_request, prompt_token_ids=range(10, 16), max_new_tokens=4, ignore_eos=True
)
"""A request of 6 prompt tokens (``request_id`` first) that holds 2 blocks once admitted."""


def add_admitted(engine: Engine, *request_ids: str) -> dict[str, Outputs]:
    """Adds the requests and schedules once, so each holds 2 blocks; returns their sinks."""
    sinks = {request_id: Outputs() for request_id in request_ids}
    for request_id, sink in sinks.items():
        engine.apply(AddRequest(six_token_request(request_id), sink))
    engine.scheduler.schedule()
    return sinks


def test_add_request_queues_it_with_its_trace_and_sink() -> None:
    engine, allocator = unstarted_engine()
    sink, trace = Outputs(), EventTrace()
    engine.apply(AddRequest(six_token_request("r"), sink, trace))  # type: ignore[arg-type]
    assert [r.request_id for r in engine.scheduler.waiting] == ["r"]
    assert engine.scheduler.requests["r"].trace is trace
    assert (engine.num_streams, sink, allocator.num_free_blocks) == (1, [], NUM_BLOCKS)


def test_add_request_hands_its_error_to_the_sink_and_adds_nothing() -> None:
    engine, _ = unstarted_engine()
    sink = Outputs()
    engine.apply(AddRequest(six_token_request("r", prompt_token_ids=()), sink))
    assert len(sink) == 1 and isinstance(sink[0], InvalidArgument)
    assert str(sink[0]) == "prompt_token_ids: empty"
    engine.fault = ERROR
    engine.apply(AddRequest(six_token_request("s"), sink))
    assert sink[1:] == [ERROR]
    assert (engine.scheduler.requests, engine.num_streams) == ({}, 0)


def test_abort_request_frees_its_blocks_and_silences_its_sink() -> None:
    engine, allocator = unstarted_engine()
    sinks = add_admitted(engine, "a", "b")
    assert allocator.num_free_blocks == NUM_BLOCKS - 4
    engine.apply(AbortRequest("a"))
    assert list(engine.scheduler.requests) == ["b"]
    assert [r.request_id for r in engine.scheduler.running] == ["b"]
    assert (allocator.num_free_blocks, engine.num_streams) == (NUM_BLOCKS - 2, 1)
    engine.apply(AbortRequest("unknown"))
    assert (list(engine.scheduler.requests), engine.num_streams) == (["b"], 1)
    assert sinks == {"a": [], "b": []}


def test_fail_all_ends_every_request_with_the_error_once_and_frees_every_block() -> None:
    engine, allocator = unstarted_engine()
    sinks = add_admitted(engine, "a", "b")
    engine.apply(AddRequest(six_token_request("waiting"), waiting := Outputs()))
    engine.apply(FailAll(ERROR))
    assert sinks == {"a": [ERROR], "b": [ERROR]} and waiting == [ERROR]
    assert not engine.scheduler.has_unfinished_requests
    assert (engine.scheduler.num_running, engine.scheduler.num_waiting) == (0, 0)
    assert allocator.num_free_blocks == NUM_BLOCKS
    assert allocator.ref_cnt == [0] * NUM_BLOCKS
    assert (engine.num_streams, engine.scheduler.kv.num_blocks_held) == (0, 0)
    assert engine.fault is None  # FailAll ends what is in flight; Engine.fail also refuses


class FailingTrace:
    """A trace whose ``finished`` raises, so the abort of its request fails midway."""

    def context_load(self) -> nullcontext:
        return nullcontext()

    def attached(self) -> nullcontext:
        return nullcontext()

    def set_context(self, *counts: int) -> None:
        pass

    def admitted(self) -> None:
        pass

    def finished(self, *args: object) -> None:
        raise RuntimeError("exporter gone")


def test_fail_all_drops_a_request_whose_abort_fails_and_reconciles_its_blocks() -> None:
    engine, allocator = unstarted_engine()
    sinks = add_admitted(engine, "a")
    engine.apply(AddRequest(six_token_request("b"), b := Outputs(), FailingTrace()))  # type: ignore[arg-type]
    engine.scheduler.schedule()
    assert allocator.num_free_blocks == NUM_BLOCKS - 4
    engine.apply(FailAll(ERROR))
    assert (sinks["a"], b) == ([ERROR], [ERROR])
    assert not engine.scheduler.has_unfinished_requests and engine.num_streams == 0
    kv = engine.scheduler.kv
    assert (kv.num_blocks_held, kv.num_blocks_in_use, kv.needs_reconcile) == (0, 0, True)
    assert allocator.num_free_blocks == NUM_BLOCKS - 2  # "b"'s 2 blocks: not freed yet
    engine.scheduler.schedule()  # reconciles (nothing held) before anything else
    assert not kv.needs_reconcile
    assert allocator.num_free_blocks == NUM_BLOCKS


def test_annotate_adds_the_event_to_every_traced_request_in_flight() -> None:
    engine, _ = unstarted_engine()
    traces = [EventTrace(), EventTrace()]
    for request_id, trace in zip(("a", "b"), traces, strict=True):
        engine.apply(AddRequest(six_token_request(request_id), Outputs(), trace))  # type: ignore[arg-type]
    engine.apply(AddRequest(six_token_request("untraced"), Outputs()))
    engine.apply(Annotate("gpu event", {"xid": 79, "severity": "fatal"}))
    assert [t.events for t in traces] == [[("gpu event", {"xid": 79, "severity": "fatal"})]] * 2
    assert len(engine.scheduler.requests) == 3


def test_wake_changes_nothing() -> None:
    engine, allocator = unstarted_engine()
    sinks = add_admitted(engine, "a")
    engine.apply(Wake())
    assert list(engine.scheduler.requests) == ["a"] and sinks == {"a": []}
    assert allocator.num_free_blocks == NUM_BLOCKS - 2


def test_anything_else_is_refused_by_apply_and_by_send() -> None:
    engine, _ = unstarted_engine()
    with pytest.raises(TypeError, match="not an engine command: \\('abort', 'a'\\)"):
        engine.apply(("abort", "a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an engine command"):
        engine.send("wake")  # type: ignore[arg-type]
    engine.process_commands()  # nothing was queued
    assert engine.scheduler.requests == {}


def test_the_thread_safe_methods_queue_their_commands_until_process_commands() -> None:
    engine, allocator = unstarted_engine()
    a, b, late = Outputs(), Outputs(), Outputs()
    trace = EventTrace()
    engine.submit(six_token_request("a"), a, trace)  # type: ignore[arg-type]
    engine.submit(six_token_request("b"), b)
    engine.annotate("gpu event", {"xid": 13})
    engine.abort("b")
    assert engine.scheduler.requests == {}  # queued, not applied
    engine.process_commands()
    assert list(engine.scheduler.requests) == ["a"] and engine.num_streams == 1
    assert trace.events == [("gpu event", {"xid": 13})]
    engine.fail(ERROR)
    engine.submit(six_token_request("late"), late)  # refused at once, on the caller's thread
    assert (engine.fault, engine.not_serving_reason, late) == (ERROR, str(ERROR), [ERROR])
    assert a == []  # the fail is applied at the next step boundary
    engine.process_commands()
    assert (a, b) == ([ERROR], []) and engine.scheduler.requests == {}
    assert allocator.num_free_blocks == NUM_BLOCKS


class BatchedOutputs(Outputs):
    """A batched sink with the given ``flush``."""

    def __init__(self, flush: Callable[[], None]) -> None:
        super().__init__()
        self.flush = flush


def test_a_drain_of_commands_flushes_each_batched_sink_once() -> None:
    engine, _ = unstarted_engine()
    flushes: list[int] = []

    def flush() -> None:
        flushes.append(1)

    sinks = [BatchedOutputs(flush) for _ in range(3)]
    for i, sink in enumerate(sinks):
        engine.send(AddRequest(six_token_request(f"r{i}"), sink))
    engine.process_commands()
    assert flushes == []  # nothing delivered yet
    engine.send(FailAll(ERROR))
    engine.process_commands()
    assert [list(sink) for sink in sinks] == [[ERROR]] * 3
    assert flushes == [1]
