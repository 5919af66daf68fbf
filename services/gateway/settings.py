"""Gateway settings: ``CORL_GATEWAY_*`` environment variables (the cohort token from
``CORL_COHORT_TOKEN``, the admin token from ``CORL_ADMIN_TOKEN``). What is harvested and which members
exist live in the cohort config file; these are the knobs of this process."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORL_GATEWAY_", env_nested_delimiter="__", extra="ignore")

    config: Path = Field(description="Cohort config file (YAML): members, run, gateway section.")
    cohort_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("CORL_COHORT_TOKEN", "cohort_token"),
        description="Required of the agent apps on every route but the probes, and sent to the members' corl "
        "servers (never to an outside endpoint); unset: open.",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("CORL_ADMIN_TOKEN", "admin_token"),
        description="Sent with POST /v1/weights when a canary version is promoted into the stable replicas.",
    )
    redis_url: str | None = Field(default=None, description="Overrides the config's redis_url.")
    redis_timeout_s: float = Field(
        default=2.0, gt=0, description="Socket timeout of a pool write: past it the prompt is dropped (counted)."
    )
    connect_timeout_s: float = Field(default=5.0, gt=0, description="Connect timeout of a forwarded request.")
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="Read timeout of a forwarded request (between two bytes of the reply)."
    )
    transport_retries: int = Field(default=1, ge=0, description="httpx connect retries on one replica.")
    attempts: int = Field(
        default=3, ge=1, description="Replicas tried when one refuses the connection (nothing was sent to it)."
    )
    max_connections: int = Field(default=512, ge=1, description="Connections to the upstreams, all together.")
    max_body_bytes: int = Field(default=8 << 20, ge=1024, description="Request body bound (413 past it).")
    max_client_concurrency: int = Field(
        default=512, ge=1, description="Requests one client may have in flight (429 past it)."
    )
    harvest_queue: int = Field(
        default=1024, ge=1, description="Harvested requests waiting for the pool writer; past it they are dropped."
    )
    harvest_workers: int = Field(default=2, ge=1, description="Pool writers, each writing one batch at a time.")
    harvest_batch: int = Field(
        default=64, ge=1, description="Queued prompts one pool writer takes at once (one Redis round trip)."
    )
    harvest_linger_ms: float = Field(
        default=20.0,
        ge=0,
        description="How long a pool writer waits after the first queued prompt before it writes, gathering those "
        "behind it: requests that come close together are answered before the write takes the event loop, and "
        "share one round trip (0: write at once).",
    )
    autostart: bool = Field(default=True, description="Start the harvest workers and the canary with the app.")
