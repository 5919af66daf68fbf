"""The tracking metrics, on the registry of the process that reports (its /metrics shows them)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from corl.prometheus import MetricSet


class TrackingMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, trackers: Iterable[str] = ()) -> None:
        m = MetricSet("corl_tracking", registry)
        self.registry = m.registry
        self.records = m.counter("records", "Records delivered to an experiment tracker.", "tracker")
        self.errors = m.counter(
            "errors", "Failed calls to an experiment tracker (the run goes on; the tracker is retried).", "tracker"
        )
        self.dropped = m.counter(
            "records_dropped",
            "Records a tracker never got (queue full, call failed, or still failing at exit).",
            "tracker",
        )
        for name in trackers:  # every series shows 0 before its first event
            for metric in (self.records, self.errors, self.dropped):
                metric.labels(name)
