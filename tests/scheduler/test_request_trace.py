"""The trace of a request: the hooks the scheduling core calls (a Protocol, so the core imports no
OpenTelemetry), in which order and with which counts, and the spans RequestTrace makes of them."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from factories import make_engine_request, make_scheduler
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from zerolayer.common.generation import FinishReason
from zerolayer.common.tracing import Tracing, TracingConfig
from zerolayer.kv.stats import PrefixHit
from zerolayer.kvstore.in_process import LocalBlockAllocator
from zerolayer.scheduler.core.scheduler import Scheduler
from zerolayer.scheduler.core.trace import RequestTraceHooks
from zerolayer.scheduler.request_trace import RequestTrace

BLOCK_SIZE = 4
PROMPT = tuple(range(10, 19))  # 9 tokens: two full blocks can be cached, the last is recomputed


class RecordingTrace:
    """Records every hook call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    @contextmanager
    def context_load(self) -> Iterator[None]:
        self.calls.append(("context_load",))
        yield
        self.calls.append(("context_load_end",))

    @contextmanager
    def attached(self) -> Iterator[None]:
        self.calls.append(("attached",))
        yield

    def set_context(
        self, num_prompt_tokens: int, num_cached_tokens: int, num_pinned_tokens: int = 0
    ) -> None:
        self.calls.append(("set_context", num_prompt_tokens, num_cached_tokens, num_pinned_tokens))

    def admitted(self) -> None:
        self.calls.append(("admitted",))

    def first_token(self) -> None:
        self.calls.append(("first_token",))

    def finished(self, reason: FinishReason, *counts: int) -> None:
        self.calls.append(("finished", reason, *counts))

    def add_event(self, name: str, attributes: Mapping[str, str | int]) -> None:
        self.calls.append(("add_event", name, dict(attributes)))


def run_to_end(scheduler: Scheduler) -> None:
    """Steps with fake token 100 for each sampling request until nothing is in flight."""
    while scheduler.has_unfinished_requests:
        output = scheduler.schedule()
        scheduler.update(output, [100 for s in output.scheduled if s.samples])


def test_the_scheduling_core_imports_no_opentelemetry() -> None:
    modules = ["engine", "engine_core", "engine_commands", "scheduler", "request", "trace"]
    code = (
        "import sys\n"
        + "".join(f"import zerolayer.scheduler.core.{m}\n" for m in modules)
        + "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_request_trace_has_every_hook_with_the_protocols_parameters() -> None:
    hooks = [name for name in vars(RequestTraceHooks) if not name.startswith("_")]
    assert sorted(hooks) == [
        "add_event",
        "admitted",
        "attached",
        "context_load",
        "finished",
        "first_token",
        "set_context",
    ]
    for name in hooks:
        expected = list(inspect.signature(getattr(RequestTraceHooks, name)).parameters)
        assert list(inspect.signature(getattr(RequestTrace, name)).parameters) == expected, name
    trace = RequestTrace(Tracing(TracingConfig("none", "test")), otel_context.get_current())
    assert isinstance(trace, RequestTraceHooks)
    assert isinstance(RecordingTrace(), RequestTraceHooks)


def test_the_scheduler_calls_the_hooks_in_a_requests_order_with_its_counts() -> None:
    scheduler, _ = make_scheduler(16, BLOCK_SIZE, max_num_seqs=4)
    first, second, untraced = RecordingTrace(), RecordingTrace(), None
    scheduler.add_request(make_engine_request("first", PROMPT, 2, ignore_eos=True), first)
    run_to_end(scheduler)
    scheduler.add_request(make_engine_request("second", PROMPT, 3, ignore_eos=True), second)
    scheduler.add_request(make_engine_request("untraced", PROMPT, 2, ignore_eos=True), untraced)
    scheduler.schedule()  # both admitted; "second" hits the two blocks "first" committed
    scheduler.annotate("gpu event", {"xid": 79})
    scheduler.abort_request("second")
    # The allocation (inside context load) and the free at the end join the request's trace.
    admission = [
        ("context_load",),
        ("attached",),
        ("set_context", 9, 0, 0),
        ("context_load_end",),
        ("admitted",),
    ]
    assert first.calls == [
        *admission,
        ("first_token",),
        ("finished", FinishReason.LENGTH, 9, 0, 2, 0),
        ("attached",),
    ]
    assert second.calls == [
        ("context_load",),
        ("attached",),
        ("set_context", 9, 8, 0),
        ("context_load_end",),
        ("admitted",),
        ("add_event", "gpu event", {"xid": 79}),
        ("finished", FinishReason.ABORT, 9, 8, 0, 0),
        ("attached",),
    ]


def test_request_trace_records_the_cached_tokens_on_its_context_load_span() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingConfig("none", "test"), exporter=exporter)
    scheduler, _ = make_scheduler(16, BLOCK_SIZE, max_num_seqs=4)
    scheduler.add_request(make_engine_request("first", PROMPT, 2, ignore_eos=True))
    run_to_end(scheduler)
    trace = RequestTrace(tracing, otel_context.get_current())
    scheduler.add_request(make_engine_request("second", PROMPT, 2, ignore_eos=True), trace)
    run_to_end(scheduler)
    tracing.shutdown()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert sorted(spans) == ["context load", "decode", "prefill", "queue"]
    assert dict(spans["context load"].attributes) == {
        "zerolayer.prompt_tokens": 9,
        "zerolayer.cached_tokens": 8,
        "zerolayer.pinned_tokens": 0,
        "zerolayer.uncached_tokens": 1,
    }
    assert spans["decode"].attributes["gen_ai.usage.output_tokens"] == 2


class FirstBlockPinned(LocalBlockAllocator):
    """An in-process pool whose lookups report their first hit block as held by a kvstore pin."""

    def lookup(self, token_ids: Sequence[int], cache_salt: str, counted: bool = True) -> PrefixHit:
        hit = super().lookup(token_ids, cache_salt, counted)
        return PrefixHit(hit.block_ids, min(len(hit.block_ids), 1))


def test_a_pinned_prefix_hit_shows_as_loading_on_the_context_load_span() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingConfig("none", "test"), exporter=exporter)
    allocator = FirstBlockPinned(16, BLOCK_SIZE)
    scheduler, _ = make_scheduler(16, BLOCK_SIZE, allocator=allocator)
    scheduler.add_request(make_engine_request("first", PROMPT, 2, ignore_eos=True))
    run_to_end(scheduler)
    recorded = RecordingTrace()
    scheduler.add_request(make_engine_request("second", PROMPT, 2, ignore_eos=True), recorded)
    trace = RequestTrace(tracing, otel_context.get_current())
    scheduler.add_request(make_engine_request("third", PROMPT, 2, ignore_eos=True), trace)
    run_to_end(scheduler)
    tracing.shutdown()
    assert ("set_context", 9, 8, BLOCK_SIZE) in recorded.calls
    [load] = [s for s in exporter.get_finished_spans() if s.name == "context load"]
    assert load.attributes["zerolayer.cached_tokens"] == 8
    assert load.attributes["zerolayer.pinned_tokens"] == BLOCK_SIZE


def test_kvstore_calls_made_for_a_request_alone_are_children_of_its_server_span() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingConfig("none", "test"), exporter=exporter)
    with tracing.tracer.start_as_current_span("server") as server:
        trace = RequestTrace(tracing, otel_context.get_current())
    # On the engine thread nothing is current: attached() makes the request's span current.
    with trace.attached(), tracing.client_span("/zerolayer.v1.KVStore/Free"):
        pass
    with trace.context_load(), trace.attached(), tracing.client_span("/x.v1.KVStore/Allocate"):
        pass
    tracing.shutdown()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert spans["zerolayer.v1.KVStore/Free"].parent.span_id == server.get_span_context().span_id
    load = spans["context load"].context.span_id
    assert spans["x.v1.KVStore/Allocate"].parent.span_id == load
    assert {s.context.trace_id for s in spans.values()} == {server.get_span_context().trace_id}
