"""Aggregator settings: ``CORL_AGGREGATOR_*`` environment variables (nested with ``__``), plus the
admin token from ``CORL_ADMIN_TOKEN``. What a run does lives in the cohort config file; these are
the knobs of this process."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from corl.proto import RewardServerMode
from corl.services.settings import ConnectRetries, ConnectTimeout, MaxBodyBytes, MaxClientConcurrency


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HttpSettings(_Section):
    connect_timeout_s: ConnectTimeout = 5.0
    transport_retries: ConnectRetries = 2
    attempts: int = Field(default=3, ge=1, description="tenacity attempts for an idempotent call.")
    backoff_initial_s: float = Field(default=0.1, ge=0)
    backoff_max_s: float = Field(default=2.0, ge=0)
    max_connections: int = Field(default=256, ge=1)


class GradingSettings(_Section):
    push_timeout_s: float = Field(default=10.0, gt=0, description="Timeout of a push grader's /v1/grade.")
    pull_deadline_s: float = Field(default=10.0, gt=0, description="How long a round waits for pull results.")
    pull_active_s: float = Field(default=60.0, gt=0, description="Pull graders silent this long get no tasks.")
    lease_s: float = Field(default=10.0, gt=0, description="A leased task not answered in time is re-offered.")
    max_wait_s: float = Field(default=30.0, ge=0, description="Cap on a long poll's wait (< redis_timeout_s).")
    max_tasks: int = Field(default=256, ge=1, description="Cap on tasks per poll.")
    items_per_round: int = Field(default=64, ge=1, description="Responses each external grader sees per round.")
    rate_limit_per_min: int = Field(default=600, ge=1, description="Requests per grader per minute.")
    max_body_bytes: MaxBodyBytes = 1 << 20
    max_client_concurrency: MaxClientConcurrency = 64
    max_graders: int = Field(default=64, ge=1, description="Bounds the grader label of metrics.")


_END_MARKERS = ["</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<eos>"]


class RewardServerSettings(_Section):
    """``POST /get_reward`` (OpenRLHF) and ``POST /v1/reward`` (slime): the cohort scores outside responses."""

    enabled: bool = Field(
        default=False,
        description="Serve the two reward routes (they spend the members' compute on any caller's text): off, "
        "they answer 404.",
    )
    token: SecretStr | None = Field(
        default=None,
        description="Bearer token the reward routes then require. OpenRLHF's and slime's clients send no headers: "
        "without a token, keep the routes on loopback or inside the cluster.",
    )
    mode: RewardServerMode = Field(
        default="consensus",
        description="consensus: 1 if the response's answer is the cohort's consensus answer (label-free); "
        "agreement: the share of member samples that agree with it; judge: members grade it in judge mode; "
        "ground_truth: 1 if it equals the request's label (the only mode that reads labels).",
    )
    samples_per_prompt: int | None = Field(default=None, ge=1, description="G per member; None: rounds' G.")
    max_concurrency: int = Field(default=4, ge=1, description="Member sampling calls in flight at once.")
    max_prompts_per_call: int = Field(default=16, ge=1, description="Prompts per member generate call.")
    cache_size: int = Field(default=4096, ge=1, description="Prompts whose member samples are kept.")
    cache_ttl_s: float = Field(default=600.0, gt=0, description="Life of cached samples (weights move on).")
    # What one reward request may be:
    max_queries: int = Field(default=4096, ge=1, description="Responses per request.")
    max_body_bytes: MaxBodyBytes = Field(
        default=8 << 20,
        description="Bound on a reward request's body, checked before it is read (413): a few thousand queries "
        "of a few KB each; raise it with max_queries for longer responses.",
    )
    timeout_s: float = Field(default=120.0, gt=0, description="A request not scored in time gets 503.")
    end_markers: list[str] = Field(
        default_factory=lambda: list(_END_MARKERS), description="Stripped from the end of a response."
    )


class AggregatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORL_AGGREGATOR_", env_nested_delimiter="__", extra="ignore")

    config: Path = Field(description="Cohort config file (YAML).")
    admin_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("CORL_ADMIN_TOKEN", "admin_token")
    )
    cohort_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("CORL_COHORT_TOKEN", "cohort_token"),
        description="Sent to the members' corl servers (never to an outside endpoint).",
    )
    redis_url: str | None = Field(default=None, description="Overrides the config's redis_url.")
    redis_timeout_s: float = Field(default=60.0, gt=0, description="Socket timeout of every Redis call.")
    autostart: bool = Field(default=True, description="Start the round driver with the app.")
    stream_maxlen: int = Field(default=10_000, ge=1, description="Approximate MAXLEN of each batch stream.")
    stats_maxlen: int = Field(default=10_000, ge=1)
    marker_ttl_s: int = Field(default=30 * 86400, ge=60, description="Life of batch-id idempotency markers.")
    backpressure_poll_s: float = Field(default=0.2, gt=0)
    quorum_retry_s: float = Field(default=1.0, gt=0, description="Wait before retrying a round without quorum.")
    stats_rounds: int = Field(default=50, ge=1, description="Rounds returned by GET /v1/runs/{run}/stats.")
    http: HttpSettings = HttpSettings()
    grading: GradingSettings = GradingSettings()
    reward_server: RewardServerSettings = RewardServerSettings()
    member_info_timeout_s: float = Field(default=2.0, gt=0, description="GET /v1/info of a member (dashboard).")
