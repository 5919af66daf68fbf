"""Every Prometheus metric of the aggregator, on a per-app registry. Labels are bounded: ``member``
(the config's members), ``grader`` (registered graders, capped by settings), ``status``/``outcome``
(fixed sets)."""

from __future__ import annotations

from corl.prometheus import MetricSet
from corl.rewards import GraderReliability, RoundOutcome
from corl.services.http import HttpMetrics


class AggregatorMetrics:
    def __init__(self) -> None:
        m = MetricSet("corl_aggregator")
        self.registry = m.registry
        self.http = HttpMetrics(m)
        self.rounds = m.counter("rounds", "Rounds by outcome (ok, no_quorum, backpressure, stale).", "status")
        self.round_seconds = m.histogram("round_duration_seconds", "Wall time of one round, generation to commit.")
        self.round = m.gauge("round", "Next round to run.")
        self.generate_seconds = m.histogram("generate_duration_seconds", "Generation call latency.", "member")
        self.member_failures = m.counter("member_failures", "Rounds a member was left out of.", "member")
        self.batches = m.counter("batches", "Graded batches appended.", "member")
        self.samples = m.counter("samples", "Graded samples appended.", "member")
        self.unconsumed = m.gauge(
            "unconsumed_batches", "Batches in a member's stream not yet delivered to its trainer.", "member"
        )
        # Per member, last round:
        self.mean_reward = m.gauge("mean_reward", "Mean reward, last round.", "member")
        self.label_rate = m.gauge("label_rate", "Fraction of prompts labelled.", "member")
        self.distinct = m.gauge("distinct_answers", "Mean distinct answers per G samples.", "member")
        self.entropy = m.gauge("answer_entropy_nats", "Mean answer entropy.", "member")
        self.response_tokens = m.gauge("mean_response_tokens", "Mean response length in tokens.", "member")
        self.label_accuracy = m.gauge(
            "pseudo_label_accuracy", "Pseudo-label accuracy vs dataset answers (diagnostic).", "member"
        )
        self.collapse = m.gauge("collapse_alarm", "1 once a member's collapse guard has tripped.", "member")
        self.cohort_diversity = m.gauge(
            "cohort_diversity_ratio", "Distinct pseudo-labels across members per prompt / members (1: all differ)."
        )
        # Outside endpoint members (corl.config.EndpointConfig):
        self.endpoint_requests = m.counter(
            "endpoint_requests",
            "HTTP requests to outside endpoint members by outcome "
            "(ok, rate_limited, server_error, client_error, timeout, transport_error).",
            "member",
            "outcome",
        )
        self.endpoint_request_seconds = m.histogram(
            "endpoint_request_duration_seconds", "Latency of an answered request to an outside endpoint.", "member"
        )
        self.endpoint_retries = m.counter("endpoint_retries", "Requests to an outside endpoint sent again.", "member")
        self.endpoint_tokens = m.counter(
            "endpoint_tokens", "Tokens in outside endpoints' usage, by kind (prompt, completion).", "member", "kind"
        )
        self.endpoint_no_answer = m.counter(
            "endpoint_no_answer_samples",
            "Endpoint samples with no usable text (missing choice, no content, unreadable reply).",
            "member",
        )
        self.endpoint_verdicts = m.counter(
            "endpoint_verdicts",
            "peer_judge verdicts of outside endpoints by source (logprobs, text, unread).",
            "member",
            "source",
        )
        self.label_share = m.gauge(
            "label_share_ratio", "Share of the other members' labels equal to its answer, last round.", "member"
        )
        # The grading pool:
        self.grader_weight = m.gauge("grader_weight", "Reliability weight.", "grader")
        self.quarantined = m.gauge("grader_quarantined", "1 while quarantined.", "grader")
        self.grading_results = m.counter(
            "grading_results", "Pull results by outcome (accepted, duplicate, late).", "outcome"
        )
        # The reward server (/get_reward, /v1/reward):
        self.reward_cache = m.counter(
            "reward_server_prompts", "Prompts scored: member samples cached (hit), shared in flight, or new.", "outcome"
        )
        self.push_failures = m.counter("push_grader_failures", "Push grader calls that failed or timed out.", "grader")

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
            if o.label_share is not None:
                self.label_share.labels(name).set(o.label_share)
            if o.pseudo_label_accuracy is not None:
                self.label_accuracy.labels(name).set(o.pseudo_label_accuracy)

    def observe_graders(self, reliability: GraderReliability, limit: int) -> None:
        for g in list(reliability.weights)[:limit]:
            self.grader_weight.labels(g).set(reliability.weight(g))
            self.quarantined.labels(g).set(int(g in reliability.quarantined))
