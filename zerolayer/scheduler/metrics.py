"""Prometheus metrics of the scheduler: latency histograms, queue and batch gauges, the scheduling
gap between steps, and page faults per generated token (from /proc/self/stat)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zerolayer.common.metrics import LATENCY_BUCKETS_S
from zerolayer.scheduler.core.request import Request

GAP_BUCKETS_US = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000)


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


class SchedulerMetrics:
    """The scheduler's metrics in a private registry (hooks are called by the engine thread)."""

    def __init__(self, registry: CollectorRegistry, gauges: Callable[[], dict[str, float]]) -> None:
        """
        Args:
            registry: where to register.
            gauges: returns the current values of ``requests_running``, ``requests_waiting`` and
                ``kv_blocks_held`` (read at scrape time).
        """
        p = "zerolayer_scheduler_"
        self.ttft = Histogram(
            p + "ttft_seconds",
            "Arrival at the scheduler to first token",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.itl = Histogram(
            p + "itl_seconds",
            "Time between consecutive tokens of a request",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.e2e = Histogram(
            p + "e2e_seconds", "Arrival to last token", buckets=LATENCY_BUCKETS_S, registry=registry
        )
        self.queue = Histogram(
            p + "queue_seconds",
            "Arrival to admission (first blocks)",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.step_gap = Histogram(
            p + "step_gap_microseconds",
            "Scheduling gap: one busy step's end to the next step's start",
            buckets=GAP_BUCKETS_US,
            registry=registry,
        )
        self.generated_tokens = Counter(
            p + "generated_tokens", "Tokens generated", registry=registry
        )
        self.prompt_tokens = Counter(
            p + "prompt_tokens", "Prompt tokens of admitted requests", registry=registry
        )
        self.cached_prompt_tokens = Counter(
            p + "cached_prompt_tokens",
            "Prompt tokens served from the prefix cache",
            registry=registry,
        )
        self.preemptions = Counter(p + "preemptions", "Requests preempted", registry=registry)
        self.num_generated_tokens = 0
        self._num_preemptions_seen = 0
        registry.register(_ProcessCollector(gauges, self))

    def on_step(self, sampled: Sequence[Request], num_preemptions: int) -> None:
        """Observes one engine step, after the scheduler's update: the token each request of
        ``sampled`` got (its queue time at its first token, its e2e time at its last), and the
        preemptions since the previous step (``num_preemptions``: the scheduler's total). Sets
        each request's ``last_token_time``."""
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
            if request.is_finished:
                self.e2e.observe(now - request.arrival_time)
        if num_preemptions > self._num_preemptions_seen:
            self.preemptions.inc(num_preemptions - self._num_preemptions_seen)
            self._num_preemptions_seen = num_preemptions

    def on_token(self, first: bool, since_arrival_s: float, since_last_s: float) -> None:
        """A request produced a token."""
        self.generated_tokens.inc()
        self.num_generated_tokens += 1
        if first:
            self.ttft.observe(since_arrival_s)
        else:
            self.itl.observe(since_last_s)

    def on_admitted(self, queue_s: float, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        """A request got its first blocks."""
        self.queue.observe(queue_s)
        self.prompt_tokens.inc(num_prompt_tokens)
        self.cached_prompt_tokens.inc(num_cached_tokens)


class _ProcessCollector(Collector):
    """Scrape-time values: batch gauges and page faults per generated token."""

    def __init__(self, gauges: Callable[[], dict[str, float]], metrics: SchedulerMetrics) -> None:
        self._gauges = gauges
        self._metrics = metrics
        self._last = (*read_page_faults(), 0)

    def collect(self) -> Iterator[Metric]:
        p = "zerolayer_scheduler_"
        for name, value in self._gauges().items():
            yield GaugeMetricFamily(p + name, name.replace("_", " "), value=value)
        minor, major = read_page_faults()
        faults = CounterMetricFamily(
            p + "page_faults", "Page faults of the scheduler process", labels=["kind"]
        )
        faults.add_metric(["minor"], minor)
        faults.add_metric(["major"], major)
        yield faults
        tokens = self._metrics.num_generated_tokens
        last_minor, last_major, last_tokens = self._last
        new_tokens = tokens - last_tokens
        per_token = ((minor + major - last_minor - last_major) / new_tokens) if new_tokens else 0.0
        self._last = (minor, major, tokens)
        yield GaugeMetricFamily(
            p + "page_faults_per_token",
            "Page faults per generated token since the previous scrape",
            value=per_token,
        )
