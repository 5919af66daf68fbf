"""Sandbox service settings: ``CORL_SANDBOX_*`` environment variables; ``corl serve sandbox`` flags win."""

from __future__ import annotations

import os

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from corl.services.settings import MaxBodyBytes, MaxClientConcurrency


class SandboxSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORL_SANDBOX_", extra="ignore")

    token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("CORL_SANDBOX_TOKEN", "token"),
        description="Bearer token its clients (model servers, the aggregator) send; unset: open (a lone test box).",
    )
    max_concurrent: int = Field(
        default_factory=lambda: max(1, os.cpu_count() or 1),
        ge=1,
        description="Programs run at once; more wait their turn (default: one per CPU).",
    )
    max_queued: int = Field(default=256, ge=1, description="Programs waiting at once; more get 503.")
    max_body_bytes: MaxBodyBytes = 2 << 20
    max_client_concurrency: MaxClientConcurrency = 512
