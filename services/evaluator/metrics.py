"""Every Prometheus metric of the evaluator, on a per-app registry. Labels are bounded: ``member`` (the
config's served members), ``stage`` (version, evaluate, record), and the HTTP edge's route and status."""

from __future__ import annotations

from corl.proto import HeldoutAccuracy
from corl.services.http import ServiceMetricSet

# A reading is tens to hundreds of generate requests: seconds on the tiny cohort, minutes on real models.
EVALUATION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class EvaluatorMetrics(ServiceMetricSet):
    def __init__(self) -> None:
        super().__init__("corl_evaluator")
        self.accuracy = self.gauge(
            "heldout_accuracy_ratio", "Latest held-out greedy accuracy (0-1), through the member's server.", "member"
        )
        self.weight_version = self.gauge("heldout_weight_version", "Weight version of that reading.", "member")
        self.duration = self.histogram(
            "evaluation_duration_seconds", "Wall time of one held-out reading.", "member", buckets=EVALUATION_BUCKETS
        )
        self.failures = self.counter(
            "failures",
            "Polls that could not finish a member, by stage: its version (server down), the evaluation, or the "
            "Redis write of the reading (each retried at the next poll).",
            "member",
            "stage",
        )

    def observe(self, member: str, reading: HeldoutAccuracy) -> None:
        self.accuracy.labels(member).set(reading.accuracy)
        self.weight_version.labels(member).set(reading.weight_version)
