"""Prometheus metrics named ``<prefix>_<name>`` on one private registry (no module-level globals).

Every service and the trainer define their metrics in one module each, through a ``MetricSet``, so
names follow one scheme (``corl_<subsystem>_<name>_<unit>``; prometheus_client adds ``_total`` to
counters) and labels are declared where the metric is.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class MetricSet:
    def __init__(self, prefix: str, registry: CollectorRegistry | None = None) -> None:
        self.prefix = prefix
        self.registry = registry or CollectorRegistry()

    def counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(f"{self.prefix}_{name}", doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(f"{self.prefix}_{name}", doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, *labels: str, buckets: Sequence[float] = LATENCY_BUCKETS) -> Histogram:
        return Histogram(f"{self.prefix}_{name}", doc, labels, buckets=buckets, registry=self.registry)
