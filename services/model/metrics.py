"""Every Prometheus metric of the model server, on a per-app registry (several apps can share a
process, e.g. in tests)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from corl.services.http import HttpMetrics

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.http = HttpMetrics("corl_server", r)
        self.generated_tokens = Counter(
            "corl_server_generated_tokens", "Tokens sampled (generate and vote grading).", registry=r
        )
        self.batch_size = Histogram(
            "corl_server_batch_size",
            "Prompts per backend generate call (dynamic batching).",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "corl_server_batch_requests",
            "Requests merged into one backend generate call.",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.weight_version = Gauge("corl_server_weight_version", "Weight version now serving.", registry=r)
        self.last_swap_duration = Gauge(
            "corl_server_last_swap_duration_seconds",
            "Load, verify and swap time of the last weight update.",
            registry=r,
        )
        self.weight_updates = Counter(
            "corl_server_weight_updates", "Weight update attempts by result.", ["result"], registry=r
        )
        self.ready = Gauge("corl_server_ready", "1 once the model is loaded.", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
