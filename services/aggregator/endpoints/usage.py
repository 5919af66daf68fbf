"""What one outside endpoint member cost and did: requests, retries, tokens, latency, unusable samples,
verdict sources. Counted twice, the same way: Prometheus metrics (``AggregatorMetrics``, labelled by
member) and plain counters for the run's stats and the dashboard (``EndpointStats``)."""

from __future__ import annotations

from collections import Counter

from corl.config import EndpointConfig
from corl.proto import EndpointStats, VerdictSource

from ..metrics import AggregatorMetrics


class EndpointUsage:
    def __init__(self, member: str, endpoint: EndpointConfig, metrics: AggregatorMetrics) -> None:
        self.member, self.endpoint, self.metrics = member, endpoint, metrics
        self.outcomes: Counter[str] = Counter()
        self.retries = self.failed_calls = self.samples = self.no_answer = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.latency_s, self.answered = 0.0, 0
        self.verdicts: Counter[VerdictSource] = Counter()
        self.last_error: str | None = None
        self.n_per_request: bool | None = None

    def request(self, outcome: str, seconds: float | None = None) -> None:
        """One HTTP request: ``ok``, ``rate_limited``, ``server_error``, ``client_error``, ``timeout``,
        ``transport_error``; ``seconds`` for an answered one."""
        self.outcomes[outcome] += 1
        self.metrics.endpoint_requests.labels(self.member, outcome).inc()
        if seconds is not None:
            self.latency_s += seconds
            self.answered += 1
            self.metrics.endpoint_request_seconds.labels(self.member).observe(seconds)

    def error(self, kind: str) -> None:
        self.last_error = kind

    def retry(self) -> None:
        self.retries += 1
        self.metrics.endpoint_retries.labels(self.member).inc()

    def tokens(self, prompt: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.metrics.endpoint_tokens.labels(self.member, "prompt").inc(prompt)
        self.metrics.endpoint_tokens.labels(self.member, "completion").inc(completion)

    def sampled(self, asked: int, no_answer: int) -> None:
        self.samples += asked
        self.no_answer += no_answer
        self.metrics.endpoint_no_answer.labels(self.member).inc(no_answer)

    def verdict(self, source: VerdictSource) -> None:
        self.verdicts[source] += 1
        self.metrics.endpoint_verdicts.labels(self.member, source).inc()

    def call_failed(self) -> None:
        self.failed_calls += 1

    def stats(self) -> EndpointStats:
        return EndpointStats(
            api=self.endpoint.api,
            model=self.endpoint.model,
            requests=sum(self.outcomes.values()),
            retries=self.retries,
            rate_limited=self.outcomes["rate_limited"],
            failed_calls=self.failed_calls,
            samples=self.samples,
            no_answer_samples=self.no_answer,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            mean_latency_s=self.latency_s / self.answered if self.answered else None,
            n_per_request=self.n_per_request,
            verdicts={s: self.verdicts[s] for s in ("logprobs", "text", "unread")},
            last_error=self.last_error,
        )
