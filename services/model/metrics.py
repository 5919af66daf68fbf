"""Every Prometheus metric of the model server, on a per-app registry (several apps can share a
process, e.g. in tests)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from corl.services.http import ServiceMetricSet

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics(ServiceMetricSet):
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__("corl_server", registry)
        self.generated_tokens = self.counter("generated_tokens", "Tokens sampled (generate and vote grading).")
        self.batch_size = self.histogram(
            "batch_size", "Prompts per backend generate call (dynamic batching).", buckets=_BATCH_BUCKETS
        )
        self.batch_requests = self.histogram(
            "batch_requests", "Requests merged into one backend generate call.", buckets=_BATCH_BUCKETS
        )
        self.stream_first_token = self.histogram(
            "stream_first_token_seconds", "Time from a streamed request's admission to its first sampled token."
        )
        self.weight_version = self.gauge("weight_version", "Weight version now serving.")
        self.last_swap_duration = self.gauge(
            "last_swap_duration_seconds", "Load, verify and swap time of the last weight update."
        )
        self.weight_updates = self.counter("weight_updates", "Weight update attempts by result.", "result")
        self.weight_transfer_seconds = self.histogram(
            "weight_transfer_seconds",
            "A version taken from the member's weight group by broadcast: from the request to the flip.",
            "member",
        )
        self.ready = self.gauge("ready", "1 once the model is loaded.")

    def render(self) -> bytes:
        return generate_latest(self.registry)
