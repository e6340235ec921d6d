"""Prometheus metrics of the scheduler: latency and length histograms, token and finish counters,
the gauges routers and autoscalers read (queue depth, KV-cache utilisation, capacity limits,
serving state), the scheduling gap between steps, page faults (from /proc/self/stat) and the
served model.

Every sequence that ends is counted once, whatever ended it (see
:meth:`SchedulerMetrics.on_finished`); the start-up warm-up is not traffic and records nothing
(the engine detaches its metrics while it runs). Rates and ratios are left to PromQL: only
counters, histograms and instantaneous gauges are exported, so what one scrape reads never
depends on another scraper.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zerolayer.common.generation import FinishReason
from zerolayer.common.metrics import LATENCY_BUCKETS_S, ServingCollector
from zerolayer.scheduler.core.request import Request

GAP_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
"""Buckets (seconds) of the gap between engine steps: 10 us to 50 ms."""

LENGTH_BUCKETS_TOKENS = tuple(float(2**i) for i in range(18))
"""Buckets (tokens) of the prompt and generation length histograms: 1, 2, 4, ... 131072."""

PREFIX = "zerolayer_scheduler_"


def read_page_faults(stat_path: str = "/proc/self/stat") -> tuple[int, int]:
    """(minor, major) page faults of this process since it started (proc(5): fields 10 and 12).

    Returns (0, 0) where /proc is not available.
    """
    try:
        with open(stat_path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    # fields[0] is field 3 (state); minflt is field 10, majflt field 12.
    return int(fields[7]), int(fields[9])


@dataclass(frozen=True)
class SchedulerGauges:
    """What the scheduler's gauges read at scrape time (callables: they are called on the
    scrape thread while the engine thread runs, so each must read one value atomically)."""

    num_running: Callable[[], int]
    """Sequences in the running set."""
    num_waiting: Callable[[], int]
    """Sequences waiting for admission (new or preempted)."""
    num_blocks_held: Callable[[], int]
    """Block references the requests hold (a block shared by k requests counts k times)."""
    num_blocks_in_use: Callable[[], int]
    """Distinct blocks the requests hold."""
    num_blocks_total: Callable[[], int]
    """Blocks of the KV pool (the kvstore's arena)."""
    max_num_seqs: int
    max_num_batched_tokens: int


class SchedulerMetrics:
    """The scheduler's metrics in a private registry (hooks are called by the engine thread)."""

    def __init__(self, registry: CollectorRegistry, gauges: SchedulerGauges) -> None:
        """
        Args:
            registry: where to register.
            gauges: what the gauges read at scrape time.
        """

        def histogram(name: str, documentation: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(PREFIX + name, documentation, buckets=buckets, registry=registry)

        p, latency, length = PREFIX, LATENCY_BUCKETS_S, LENGTH_BUCKETS_TOKENS
        self.ttft = histogram(
            "ttft_seconds", "Arrival at the scheduler to first token, per sequence", latency
        )
        self.itl = histogram(
            "itl_seconds", "Time between consecutive tokens of a sequence", latency
        )
        self.e2e = histogram(
            "e2e_seconds",
            "Arrival to end of every sequence that ended, whatever the reason (last token, or "
            "abort: a client cancel, a frontend stop string, a failure)",
            latency,
        )
        self.queue = histogram(
            "queue_seconds",
            "Arrival to admission (first blocks), per sequence with a token",
            latency,
        )
        self.step_gap = histogram(
            "step_gap_seconds",
            "Scheduling gap: one busy step's end to the next step's start",
            GAP_BUCKETS_S,
        )
        self.prompt_length = histogram(
            "prompt_length_tokens",
            "Prompt tokens per admitted sequence (at its first token)",
            length,
        )
        self.generation_length = histogram(
            "generation_length_tokens", "Tokens generated per sequence that ended", length
        )
        self.generated_tokens = Counter(
            p + "generated_tokens", "Tokens generated", registry=registry
        )
        self.prompt_tokens = Counter(
            p + "prompt_tokens",
            "Prompt tokens of admitted sequences, counted once per sequence at its first token "
            "(a preemption's recompute does not count again); a request with n samples counts n",
            registry=registry,
        )
        self.cached_prompt_tokens = Counter(
            p + "cached_prompt_tokens",
            "Of prompt_tokens_total, those whose KV came from the prefix cache at the first "
            "admission; rate(cached_prompt_tokens_total) / rate(prompt_tokens_total) is the "
            "prefix-cache hit ratio",
            registry=registry,
        )
        self.preemptions = Counter(p + "preemptions", "Sequences preempted", registry=registry)
        self.finished = Counter(
            p + "finished_requests",
            "Sequences that ended, by finish reason (LENGTH, EOS, STOP: a stop token id, ABORT: "
            "cancelled, failed, or aborted by the frontend, which matches stop strings itself)",
            ["finish_reason"],
            registry=registry,
        )
        for reason in FinishReason:
            if reason != FinishReason.UNSPECIFIED:
                self.finished.labels(reason.name)
        self._num_preemptions_seen = 0
        registry.register(_ScrapeTimeCollector(gauges))

    def on_step(self, sampled: Sequence[Request], num_preemptions: int) -> None:
        """Observes one engine step, after the scheduler's update: the token each request of
        ``sampled`` got (its queue time and prompt at its first token), and the preemptions since
        the previous step (``num_preemptions``: the scheduler's total). Sets each request's
        ``last_token_time``. A request that this step finished is observed by
        :meth:`on_finished` (the scheduler calls it)."""
        now = time.monotonic()
        for request in sampled:
            first = request.last_token_time is None
            if first:
                self.on_admitted(
                    (request.admitted_time or now) - request.arrival_time,
                    request.num_prompt_tokens,
                    request.num_cached_tokens,
                )
            self.on_token(first, now - request.arrival_time, now - (request.last_token_time or now))
            request.last_token_time = now
        self.skip_preemptions(num_preemptions, count=True)

    def skip_preemptions(self, num_preemptions: int, count: bool = False) -> None:
        """Takes the scheduler's preemption total as seen; with ``count``, counts those since
        the previous call (the engine calls it without after its warm-up)."""
        if count and num_preemptions > self._num_preemptions_seen:
            self.preemptions.inc(num_preemptions - self._num_preemptions_seen)
        self._num_preemptions_seen = num_preemptions

    def on_token(self, first: bool, since_arrival_s: float, since_last_s: float) -> None:
        """A request produced a token."""
        self.generated_tokens.inc()
        if first:
            self.ttft.observe(since_arrival_s)
        else:
            self.itl.observe(since_last_s)

    def on_admitted(self, queue_s: float, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        """A request got its first token (admitted once: its first blocks)."""
        self.queue.observe(queue_s)
        self.prompt_tokens.inc(num_prompt_tokens)
        self.prompt_length.observe(num_prompt_tokens)
        self.cached_prompt_tokens.inc(num_cached_tokens)

    def on_finished(self, request: Request) -> None:
        """A sequence ended (:attr:`Request.finish_reason` set): by its last token, or aborted
        (a client cancel, the frontend after a stop string, a failure) with or without tokens.
        Records its end-to-end time (arrival to now), its reason and its generated length."""
        self.e2e.observe(time.monotonic() - request.arrival_time)
        self.finished.labels(request.finish_reason.name).inc()
        self.generation_length.observe(len(request.output_token_ids))


def register_model_info(registry: CollectorRegistry, model: str, fingerprint: str) -> None:
    """Exports ``zerolayer_scheduler_model_info{model,fingerprint} 1``.

    Args:
        model: the name the model is served under (the loader's ``--served-model-name``).
        fingerprint: the loader's weight fingerprint (hex digest over config.json and every
            weight file's header, size and mtime): it changes when the weights do.
    """
    info = Info(PREFIX + "model", "The served model", registry=registry)
    info.info({"model": model, "fingerprint": fingerprint})


def register_serving(registry: CollectorRegistry, serving: Callable[[], bool]) -> None:
    """Exports ``zerolayer_scheduler_serving``: 1 while ``serving()`` (the scheduler service's
    gRPC health is SERVING), else 0 (starting or warming up, a standby, the kvstore down past
    its grace, a failed GPU, draining)."""
    registry.register(
        ServingCollector(PREFIX, "1 while the scheduler's gRPC health is SERVING, else 0", serving)
    )


class _ScrapeTimeCollector(Collector):
    """Scrape-time values: queue, KV and capacity gauges and page faults."""

    def __init__(self, gauges: SchedulerGauges) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        p, g = PREFIX, self._gauges
        in_use, total = g.num_blocks_in_use(), g.num_blocks_total()
        values = (
            ("requests_running", "Sequences in the running set (batch)", g.num_running()),
            ("requests_waiting", "Sequences waiting for admission (queue)", g.num_waiting()),
            (
                "kv_blocks_held",
                "KV block references held by this scheduler's sequences: a block shared by "
                "k sequences (a common prefix) counts k times",
                g.num_blocks_held(),
            ),
            (
                "kv_cache_utilization",
                "Fraction (0..1) of the KV pool's blocks this scheduler's sequences hold, each "
                "distinct block once; cached blocks nobody holds count as free. Schedulers "
                "sharing one kvstore each report their own share (a block two of them hold "
                "counts in both)",
                in_use / total if total else 0.0,
            ),
            ("max_num_seqs", "Most sequences in one batch (--max-num-seqs)", g.max_num_seqs),
            (
                "max_num_batched_tokens",
                "Most tokens in one engine step (--max-num-batched-tokens)",
                g.max_num_batched_tokens,
            ),
        )
        for name, documentation, value in values:
            yield GaugeMetricFamily(p + name, documentation, value=value)
        minor, major = read_page_faults()
        faults = CounterMetricFamily(
            p + "page_faults", "Page faults of the scheduler process", labels=["kind"]
        )
        faults.add_metric(["minor"], minor)
        faults.add_metric(["major"], major)
        yield faults
