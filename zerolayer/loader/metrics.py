"""Prometheus metrics of the loader: weight bytes and how many are resident in the page cache."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zerolayer.loader.weight_store import WeightStore


class LoaderCollector(Collector):
    """Reads residency (mincore) at scrape time."""

    def __init__(self, store: WeightStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        total, resident = self._store.residency()
        yield GaugeMetricFamily(
            "zerolayer_loader_weight_bytes", "Bytes of the weight files", value=total
        )
        yield GaugeMetricFamily(
            "zerolayer_loader_resident_bytes",
            "Bytes of the weight files resident in the page cache",
            value=resident,
        )
