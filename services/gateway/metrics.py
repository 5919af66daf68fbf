"""Every Prometheus metric of the gateway, on a per-app registry. Labels are bounded: ``member`` (the
config's members), ``route`` (chat, completions), ``status`` (HTTP status), ``reason`` and
``decision`` (fixed sets)."""

from __future__ import annotations

from corl.services.http import ServiceMetricSet

UPSTREAM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class GatewayMetrics(ServiceMetricSet):
    def __init__(self) -> None:
        super().__init__("corl_gateway")
        self.forwarded = self.counter(
            "forwarded_requests", "Requests forwarded, by member, route and the upstream's status.", "member", "route",
            "status",
        )  # fmt: skip
        self.upstream_failures = self.counter(
            "upstream_failures", "Requests no replica of the member answered (503 to the app).", "member"
        )
        self.upstream_seconds = self.histogram(
            "upstream_response_seconds",
            "Time from forwarding to the upstream's response head, by member.",
            "member",
            buckets=UPSTREAM_BUCKETS,
        )
        # Harvesting (the run-wide counts are in Redis, corl:{run}:harvest:stats; these count this process):
        self.harvested = self.counter("prompts_harvested", "Conversations stored in the run's prompt pool.")
        self.redacted = self.counter("prompts_redacted", "Stored conversations in which redaction replaced something.")
        self.dropped = self.counter(
            "prompts_dropped",
            "Sampled conversations not stored, by reason (queue_full, pool_down, too_large, unreadable, duplicate, "
            "redaction_failed); their requests were served.",
            "reason",
        )
        self.queue_depth = self.gauge("harvest_queue_depth", "Harvested requests waiting for a pool writer.")
        self.pool_write_seconds = self.histogram(
            "pool_write_seconds", "Time of one pool write (redaction excluded).", buckets=UPSTREAM_BUCKETS
        )
        # Canary (gateway.canary):
        self.serving_version = self.gauge("serving_version", "Weight version serving the member's traffic.", "member")
        self.canary_version = self.gauge("canary_version", "Version under canary (0: none).", "member")
        self.canary_share = self.gauge("canary_share_ratio", "Share of the member's traffic the canary gets.", "member")
        self.canary_decisions = self.counter(
            "canary_decisions", "Canary decisions (promote, rollback).", "member", "decision"
        )
