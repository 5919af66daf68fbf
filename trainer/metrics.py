"""Every Prometheus metric of the trainer, in one private registry (no module-level globals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from corl.prometheus import MetricSet

if TYPE_CHECKING:
    from .policy import StepStats


_SECONDS = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100)  # histogram buckets of every duration


class TrainerMetrics:
    def __init__(self, member: str, registry: CollectorRegistry | None = None):
        m = MetricSet("corl_trainer", registry)
        self.registry = m.registry

        def g(name: str, doc: str) -> Gauge:
            return m.gauge(name, doc, "member")

        def c(name: str, doc: str) -> Counter:
            return m.counter(name, doc, "member")

        def h(name: str, doc: str) -> Histogram:
            return m.histogram(name, doc, "member", buckets=_SECONDS)

        self.loss = g("loss", "Policy loss of the last step.")
        self.mean_reward = g("mean_reward", "Mean reward of the last batch.")
        self.advantage_std = g("advantage_std", "Std of the advantages trained on in the last batch.")
        self.clip_fraction = g("clip_fraction_ratio", "Response tokens whose ratio was clipped (last step).")
        self.approx_kl = g("approx_kl", "k3 KL(sampling policy || current policy) per token (last step).")
        self.ref_kl = g("ref_kl", "k3 KL to the starting weights per token (last step; beta > 0 only).")
        self.entropy = g("entropy_nats", "Mean policy entropy per response token (last step).")
        self.tokens_per_second = g("tokens_per_second", "Tokens (prompt + response) processed per second (last step).")
        self.version_lag = g("version_lag", "Trainer version minus the version that generated the last batch.")
        self.backlog = g("stream_backlog_batches", "Batches in the member's stream not yet acknowledged.")
        self.weight_version = g("weight_version", "Newest published weight version.")
        self.step = g("step", "Batches applied (global step).")
        self.grad_norm = g("grad_norm", "Gradient norm before clipping (last step).")
        self.step_seconds = h("step_seconds", "Wall time of one training step.")
        self.batches_applied = c("batches_applied_total", "Batches trained on.")
        self.stale_dropped = c("stale_batches_dropped_total", "Batches dropped as generated too many versions ago.")
        self.invalid_dropped = c("invalid_batches_dropped_total", "Stream entries that were not a valid batch.")
        self.duplicates = c("duplicate_batches_total", "Replayed batches skipped because already applied.")
        self.groups_skipped = c("groups_skipped_total", "Prompt groups with equal rewards (no signal).")
        self.publishes = c("publishes_total", "Weight versions written to the weights store.")
        self.push_failures = c("push_failures_total", "Replica weight pushes that failed after retries.")
        self.weight_broadcast_seconds = h(
            "weight_broadcast_seconds",
            "One version broadcast to the member's weight group: from the first byte to every replica's answer.",
        )
        self.weight_broadcast_bytes = c("weight_broadcast_bytes_total", "Bytes of weights sent to the weight group.")
        self.publish_stall_seconds = h(
            "publish_stall_seconds",
            "What one publish holds training up: the wait for the CPU snapshot (broadcast) or the whole write and "
            "push (files).",
        )
        self.checkpoints = c("checkpoints_total", "Durable checkpoints written.")
        self.member = member
        # Touch every series so counters show 0 before their first event (absent series break rate()).
        for metric in vars(self).values():
            if isinstance(metric, Gauge | Counter | Histogram):
                metric.labels(member=member)

    def labels(self, metric: Gauge | Counter | Histogram):  # type: ignore[no-untyped-def]
        return metric.labels(member=self.member)

    def set(self, gauge: Gauge, value: float) -> None:
        gauge.labels(member=self.member).set(value)

    def record_step(self, s: StepStats, step: int) -> None:
        """What one training step did."""
        self.set(self.mean_reward, s.mean_reward)
        self.labels(self.batches_applied).inc()
        self.set(self.step, step)
        if s.groups_skipped:
            self.labels(self.groups_skipped).inc(s.groups_skipped)
        if not s.sequences:
            return
        for gauge, value in (
            (self.loss, s.loss),
            (self.advantage_std, s.advantage_std),
            (self.clip_fraction, s.clip_fraction),
            (self.approx_kl, s.approx_kl),
            (self.entropy, s.entropy),
            (self.grad_norm, s.grad_norm),
            (self.tokens_per_second, s.tokens_per_second),
        ):
            self.set(gauge, value)
        if s.ref_kl is not None:
            self.set(self.ref_kl, s.ref_kl)
        self.labels(self.step_seconds).observe(s.seconds)

    def serve(self, port: int, host: str = "0.0.0.0"):  # type: ignore[no-untyped-def]
        """Start the /metrics endpoint in a daemon thread; returns the server (``shutdown()`` to stop)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
