"""Every Prometheus metric of the aggregator, on a per-app registry. Labels are bounded: ``member``
(the config's members), ``grader`` (registered graders, capped by settings), ``status``/``outcome``
(fixed sets)."""

from __future__ import annotations

from operator import attrgetter

from corl.rewards import GraderReliability, RoundOutcome
from corl.services.http import ServiceMetricSet

# The per-member gauges of a graded round: metric name, help, and the figure of the member's outcome
# (corl.rewards.MemberOutcome) it shows; a figure the round did not measure (None) leaves it as it was.
_MEMBER_FIGURES = (
    ("mean_reward", "Mean reward, last round.", "diagnostics.mean_reward"),
    ("label_rate", "Fraction of prompts labelled.", "diagnostics.label_rate"),
    ("distinct_answers", "Mean distinct answers per G samples.", "diagnostics.distinct_answers"),
    ("answer_entropy_nats", "Mean answer entropy.", "diagnostics.answer_entropy"),
    ("mean_response_tokens", "Mean response length in tokens.", "diagnostics.mean_response_tokens"),
    ("pseudo_label_accuracy", "Pseudo-label accuracy vs dataset answers (diagnostic).", "pseudo_label_accuracy"),
    ("label_share_ratio", "Share of the other members' labels equal to its answer, last round.", "label_share"),
)


class AggregatorMetrics(ServiceMetricSet):
    def __init__(self) -> None:
        super().__init__("corl_aggregator")
        self.rounds = self.counter("rounds", "Rounds by outcome (ok, no_quorum, backpressure, stale).", "status")
        self.round_seconds = self.histogram("round_duration_seconds", "Wall time of one round, generation to commit.")
        self.round = self.gauge("round", "Next round to run.")
        self.generate_seconds = self.histogram("generate_duration_seconds", "Generation call latency.", "member")
        self.member_failures = self.counter("member_failures", "Rounds a member was left out of.", "member")
        self.batches = self.counter("batches", "Graded batches appended.", "member")
        self.samples = self.counter("samples", "Graded samples appended.", "member")
        self.unconsumed = self.gauge(
            "unconsumed_batches", "Batches in a member's stream not yet delivered to its trainer.", "member"
        )
        # Per member, last round:
        self.member_figures = [
            (self.gauge(name, doc, "member"), attrgetter(figure)) for name, doc, figure in _MEMBER_FIGURES
        ]
        self.collapse = self.gauge("collapse_alarm", "1 once a member's collapse guard has tripped.", "member")
        self.cohort_diversity = self.gauge(
            "cohort_diversity_ratio", "Distinct pseudo-labels across members per prompt / members (1: all differ)."
        )
        # Outside endpoint members (corl.config.EndpointConfig):
        self.endpoint_requests = self.counter(
            "endpoint_requests",
            "HTTP requests to outside endpoint members by outcome "
            "(ok, rate_limited, server_error, client_error, timeout, transport_error).",
            "member",
            "outcome",
        )
        self.endpoint_request_seconds = self.histogram(
            "endpoint_request_duration_seconds", "Latency of an answered request to an outside endpoint.", "member"
        )
        self.endpoint_retries = self.counter(
            "endpoint_retries", "Requests to an outside endpoint sent again.", "member"
        )
        self.endpoint_tokens = self.counter(
            "endpoint_tokens", "Tokens in outside endpoints' usage, by kind (prompt, completion).", "member", "kind"
        )
        self.endpoint_no_answer = self.counter(
            "endpoint_no_answer_samples",
            "Endpoint samples with no usable text (missing choice, no content, unreadable reply).",
            "member",
        )
        self.endpoint_verdicts = self.counter(
            "endpoint_verdicts",
            "peer_judge verdicts of outside endpoints by source (logprobs, text, unread).",
            "member",
            "source",
        )
        # The grading pool:
        self.grader_weight = self.gauge("grader_weight", "Reliability weight.", "grader")
        self.quarantined = self.gauge("grader_quarantined", "1 while quarantined.", "grader")
        self.grading_results = self.counter(
            "grading_results", "Pull results by outcome (accepted, duplicate, late).", "outcome"
        )
        # The reward server (/get_reward, /v1/reward):
        self.reward_cache = self.counter(
            "reward_server_prompts", "Prompts scored: member samples cached (hit), shared in flight, or new.", "outcome"
        )
        self.push_failures = self.counter(
            "push_grader_failures", "Push grader calls that failed or timed out.", "grader"
        )
        # The gateway's prompt pool (rounds.prompt_source: harvest):
        self.harvest_trained = self.counter(
            "harvested_prompts_trained", "Harvested conversations in committed rounds with a batch written."
        )

    def observe(self, outcome: RoundOutcome, alarms: dict[str, bool]) -> None:
        """The per-member gauges of one graded round."""
        self.cohort_diversity.set(outcome.cohort_diversity)
        for name, member in outcome.members.items():
            for gauge, figure in self.member_figures:
                if (value := figure(member)) is not None:
                    gauge.labels(name).set(value)
            self.collapse.labels(name).set(int(alarms.get(name, False)))

    def observe_graders(self, reliability: GraderReliability, limit: int) -> None:
        for g in list(reliability.weights)[:limit]:
            self.grader_weight.labels(g).set(reliability.weight(g))
            self.quarantined.labels(g).set(int(g in reliability.quarantined))
