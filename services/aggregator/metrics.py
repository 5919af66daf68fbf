"""Every Prometheus metric of the aggregator, on a per-app registry. Labels are bounded: ``member``
(the config's members), ``grader`` (registered graders, capped by settings), ``status``/``outcome``
(fixed sets)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from corl.rewards import GraderReliability, RoundOutcome
from corl.services.http import HttpMetrics


class AggregatorMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.http = HttpMetrics("corl_aggregator", r)
        self.rounds = Counter(
            "corl_aggregator_rounds_total", "Rounds by outcome (ok, no_quorum, backpressure).", ["status"], registry=r
        )
        self.round_seconds = Histogram(
            "corl_aggregator_round_duration_seconds",
            "Wall time of one round, generation to commit.",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.round = Gauge("corl_aggregator_round", "Next round to run.", registry=r)
        self.generate_seconds = Histogram(
            "corl_aggregator_generate_duration_seconds",
            "Generation call latency per member.",
            ["member"],
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.member_failures = Counter(
            "corl_aggregator_member_failures_total", "Rounds a member was left out of.", ["member"], registry=r
        )
        self.batches = Counter("corl_aggregator_batches_total", "Graded batches appended.", ["member"], registry=r)
        self.samples = Counter("corl_aggregator_samples_total", "Graded samples appended.", ["member"], registry=r)
        self.unconsumed = Gauge(
            "corl_aggregator_unconsumed_batches",
            "Batches in a member's stream not yet delivered to its trainer.",
            ["member"],
            registry=r,
        )
        self.mean_reward = Gauge("corl_aggregator_mean_reward", "Mean reward, last round.", ["member"], registry=r)
        self.label_rate = Gauge("corl_aggregator_label_rate", "Fraction of prompts labelled.", ["member"], registry=r)
        self.distinct = Gauge(
            "corl_aggregator_distinct_answers", "Mean distinct answers per G samples.", ["member"], registry=r
        )
        self.entropy = Gauge("corl_aggregator_answer_entropy_nats", "Mean answer entropy.", ["member"], registry=r)
        self.response_tokens = Gauge(
            "corl_aggregator_mean_response_tokens", "Mean response length in tokens.", ["member"], registry=r
        )
        self.label_accuracy = Gauge(
            "corl_aggregator_pseudo_label_accuracy",
            "Pseudo-label accuracy vs dataset answers (diagnostic).",
            ["member"],
            registry=r,
        )
        self.cohort_diversity = Gauge(
            "corl_aggregator_cohort_diversity_ratio",
            "Distinct pseudo-labels across members per prompt / members, last round (1: all differ).",
            registry=r,
        )
        self.collapse = Gauge(
            "corl_aggregator_collapse_alarm", "1 while a member's collapse alarm is raised.", ["member"], registry=r
        )
        self.grader_weight = Gauge("corl_aggregator_grader_weight", "Reliability weight.", ["grader"], registry=r)
        self.quarantined = Gauge("corl_aggregator_grader_quarantined", "1 while quarantined.", ["grader"], registry=r)
        self.grading_results = Counter(
            "corl_aggregator_grading_results_total",
            "Pull results by outcome (accepted, duplicate, late).",
            ["outcome"],
            registry=r,
        )
        self.push_failures = Counter(
            "corl_aggregator_push_grader_failures_total",
            "Push grader calls that failed or timed out.",
            ["grader"],
            registry=r,
        )

    def observe(self, outcome: RoundOutcome, alarms: dict[str, bool]) -> None:
        """The per-member gauges of one graded round."""
        self.cohort_diversity.set(outcome.cohort_diversity)
        for name, o in outcome.members.items():
            d = o.diagnostics
            self.mean_reward.labels(name).set(d.mean_reward)
            self.label_rate.labels(name).set(d.label_rate)
            self.distinct.labels(name).set(d.distinct_answers)
            self.entropy.labels(name).set(d.answer_entropy)
            self.response_tokens.labels(name).set(d.mean_response_tokens)
            self.collapse.labels(name).set(int(alarms.get(name, False)))
            if o.pseudo_label_accuracy is not None:
                self.label_accuracy.labels(name).set(o.pseudo_label_accuracy)

    def observe_graders(self, reliability: GraderReliability, limit: int) -> None:
        for g in list(reliability.weights)[:limit]:
            self.grader_weight.labels(g).set(reliability.weight(g))
            self.quarantined.labels(g).set(int(g in reliability.quarantined))
