"""Prometheus endpoint setup: one private registry per process (no global default registry)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zerolayer.common.settings import METRICS_HOST

LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)
"""Histogram buckets (seconds) of the latency metrics every layer uses (TTFT, ITL, e2e, queue);
up to 30 minutes, as long requests run."""


def serve_metrics(
    port: int, collectors: Iterable[Collector], host: str = METRICS_HOST.default
) -> CollectorRegistry:
    """Registers ``collectors`` in a new registry and serves it on ``http://host:port/metrics``.

    Every layer's registry also holds prometheus-client's process collector
    (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
    ``process_start_time_seconds``, ``process_open_fds``, ...; read from ``/proc``, so Linux only)
    and platform collector (``python_info``): a layer's restart shows as a new start time.

    Args:
        port: TCP port; 0 means no endpoint (the registry is still returned, e.g. for tests).

    Raises:
        OSError: the port cannot be bound.
    """
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    for collector in collectors:
        registry.register(collector)
    if port:
        # NOTE: "[::1]" as --listen writes IPv6; the HTTP server takes the bare address.
        start_http_server(port, addr=host.removeprefix("[").removesuffix("]"), registry=registry)
    return registry


class ServingCollector(Collector):
    """``<prefix>serving``: 1 while ``serving()`` (a layer's gRPC health for its service says
    SERVING, e.g. :meth:`zerolayer.common.server.LayerServer.is_serving`), else 0; read at scrape
    time. Routers and dashboards read it as the layer's serving state."""

    def __init__(self, prefix: str, help_text: str, serving: Callable[[], bool]) -> None:
        """
        Args:
            prefix: the layer's metric prefix, e.g. ``"zerolayer_kv_"``.
            help_text: the gauge's HELP line (what SERVING means for this layer).
            serving: called at every scrape, from the metrics server's thread.
        """
        self._name = prefix + "serving"
        self._help = help_text
        self._serving = serving

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._help, value=1.0 if self._serving() else 0.0)
