"""Outside OpenAI-compatible endpoints as cohort members: their API kinds and what the aggregator
reports of them (``RunStats.endpoints``, the dashboard's ``MemberView.endpoint``). The key an
endpoint is reached with never appears here."""

from typing import Literal

from pydantic import Field

from ._base import WireModel

EndpointApi = Literal["openai-chat", "openai-completions"]
VerdictSource = Literal["logprobs", "text", "unread"]


class EndpointStats(WireModel):
    """Counters of one endpoint member since the aggregator started (its Prometheus metrics count the same)."""

    api: EndpointApi
    model: str = Field(description="The model name the endpoint serves.")
    requests: int = Field(ge=0, description="HTTP requests sent, retries included.")
    retries: int = Field(ge=0, description="Requests sent again after a 429, a 5xx or a connection error.")
    rate_limited: int = Field(ge=0, description="429 replies.")
    failed_calls: int = Field(ge=0, description="Sampling or judging calls that failed: the member left out of it.")
    samples: int = Field(ge=0, description="Samples asked for.")
    no_answer_samples: int = Field(
        ge=0, description="Samples with no usable text (a missing choice, no content, an unreadable reply)."
    )
    prompt_tokens: int = Field(ge=0, description="From the replies' usage.")
    completion_tokens: int = Field(ge=0, description="From the replies' usage.")
    mean_latency_s: float | None = Field(ge=0.0, description="Mean time of an answered request (None: none yet).")
    n_per_request: bool | None = Field(
        description="True: one request asks for n samples; False: one request per sample; None: not yet known."
    )
    verdicts: dict[VerdictSource, int] = Field(
        description="peer_judge verdicts by where they were read: the reply's logprobs, its text, or neither."
    )
    last_error: str | None = Field(description="Kind of the latest failed request (e.g. 'HTTP 503', 'ReadTimeout').")
