"""The per-process metrics registry every layer serves: its own collectors plus the process's
CPU, memory and start time."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from zerolayer.common.metrics import ServingCollector, serve_metrics


class OneGauge(Collector):
    def collect(self):  # noqa: ANN201
        yield GaugeMetricFamily("zerolayer_test_value", "A value", value=7)


def test_registry_holds_the_collectors_and_the_process_metrics() -> None:
    registry = serve_metrics(0, [OneGauge()])
    assert registry.get_sample_value("zerolayer_test_value") == 7
    start = registry.get_sample_value("process_start_time_seconds")
    assert start is not None and time.time() - 3600 * 24 * 365 < start <= time.time()
    assert registry.get_sample_value("process_cpu_seconds_total") > 0
    assert registry.get_sample_value("process_resident_memory_bytes") > 0
    assert registry.get_sample_value("process_open_fds") > 0
    assert registry.get_sample_value("process_max_fds") > 0
    names = {metric.name for metric in registry.collect()}
    assert "python_info" in names


def test_each_registry_is_its_own() -> None:
    """Two registries in one process (the tests' in-process layers) do not clash."""
    first, second = serve_metrics(0, [OneGauge()]), serve_metrics(0, [OneGauge()])
    start = first.get_sample_value("process_start_time_seconds")
    assert start is not None and second.get_sample_value("process_start_time_seconds") == start


def test_the_serving_gauge_follows_the_layer_health_at_each_scrape() -> None:
    state = {"serving": False}
    registry = serve_metrics(
        0, [ServingCollector("zerolayer_test_", "serving?", lambda: state["serving"])]
    )
    assert registry.get_sample_value("zerolayer_test_serving") == 0
    state["serving"] = True
    assert registry.get_sample_value("zerolayer_test_serving") == 1


def test_an_ipv6_host_in_brackets_is_served() -> None:
    # --metrics-host '[::1]', written as --listen writes IPv6 addresses
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    with socket.socket(socket.AF_INET6) as s:
        try:
            s.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback on this machine")
        port = s.getsockname()[1]
    serve_metrics(port, [OneGauge()], host="[::1]")
    with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=5) as response:
        assert b"zerolayer_test_value 7.0" in response.read()
