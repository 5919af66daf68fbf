"""Evaluator settings: ``CORL_EVALUATOR_*`` environment variables; ``corl serve evaluator`` flags win.
What the run is (task, members, sampling) lives in the cohort config file."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from corl.services.settings import ConnectRetries, ConnectTimeout


class EvaluatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORL_EVALUATOR_", env_nested_delimiter="__", extra="ignore")

    config: Path = Field(description="Cohort config file (YAML).")
    eval_every: int = Field(
        default=10, ge=1, description="Read a member again once its server is this many versions past its last reading."
    )
    eval_prompts: int = Field(
        default=200, ge=1, description="Held-out problems per reading (the first N of the task's held-out split)."
    )
    poll_s: float = Field(default=10.0, gt=0, description="Seconds between two polls of the members' weight versions.")
    autostart: bool = Field(default=True, description="Start polling with the app (tests poll by hand).")
    redis_url: str | None = Field(default=None, description="Overrides the config's redis_url.")
    cohort_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("CORL_COHORT_TOKEN", "cohort_token"),
        description="Sent to the members' servers and required on this service's readings route; unset: open.",
    )
    redis_timeout_s: float = Field(default=10.0, gt=0, description="Socket timeout of every Redis call.")
    record_attempts: int = Field(default=3, ge=1, description="tenacity attempts of a reading's Redis write.")
    info_timeout_s: float = Field(default=5.0, gt=0, description="Timeout of a member's GET /v1/info.")
    connect_timeout_s: ConnectTimeout = 5.0
    transport_retries: ConnectRetries = 2
    stop_timeout_s: float = Field(
        default=30.0, gt=0, description="How long shutdown waits for a reading in progress to stop."
    )
