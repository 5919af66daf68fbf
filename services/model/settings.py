"""Model server settings: environment (prefix ``CORL_``), overridden by CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from corl.services.settings import MaxBodyBytes, MaxClientConcurrency

from .backends.vllm_engine import EngineOptions


def engine_env(options: dict[str, Any]) -> dict[str, str]:
    """The environment that sets these vLLM engine options (``EngineOptions`` fields) on a model server:
    ``CORL_VLLM__<OPTION>``. How a member's ``vllm`` section reaches the servers ``corl run`` starts."""
    unknown = sorted(options.keys() - EngineOptions.model_fields.keys())
    if unknown:
        raise ValueError(f"not vLLM engine options of the model server: {unknown}")
    return {f"CORL_VLLM__{k.upper()}": str(v) for k, v in options.items()}


class BatchingSettings(BaseModel):
    """Dynamic batching of concurrent generate calls (``CORL_BATCH__WINDOW_MS`` etc.)."""

    model_config = ConfigDict(extra="forbid")

    window_ms: float = Field(default=50.0, ge=0.0, description="Under load, wait this long for more requests to merge.")
    max_sequences: int = Field(default=1024, ge=1, description="Cap on prompts x n in one backend call.")


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORL_", env_nested_delimiter="__", extra="ignore")

    model_dir: str | None = Field(default=None, description="save_pretrained directory of the member.")
    name: str | None = Field(default=None, description="Member name; default: the directory's name.")
    backend: Literal["transformers", "vllm"] = "transformers"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    admin_token: SecretStr | None = Field(default=None, description="Bearer token for POST /v1/weights.")
    cohort_token: SecretStr | None = Field(
        default=None,
        description="Bearer token for /v1/generate, /v1/grade and the OpenAI routes (CORL_COHORT_TOKEN); unset: open.",
    )
    weights_root: Path | None = Field(
        default=None,
        description="The weights store: POST /v1/weights loads only directories under it (403 otherwise). "
        "Unset: any directory this process can read (the admin token is then the only guard).",
    )
    initial_weight_version: int = Field(default=0, ge=0)
    device: str = "auto"
    num_threads: int | None = Field(default=None, ge=1, description="torch intra-op threads (transformers).")

    max_prompts: int = Field(default=256, ge=1, description="Prompts per generate call / items per grade call.")
    max_n: int = Field(default=64, ge=1, description="Bound on n and n_votes.")
    max_rows: int = Field(
        default=1024, ge=1, description="Bound on the sequences one call decodes (prompts x n): 256 x 64 is too many."
    )
    tasks: str | None = Field(
        default=None,
        description="Tasks /v1/grade serves, a comma list (CORL_TASKS; corl run, compose and Helm set the run's "
        "task). Unset: every task but code, whose answers run programs: a server runs them only when told to.",
    )
    max_tokens: int = Field(default=256, ge=1)
    max_body_bytes: MaxBodyBytes = 1 << 20
    max_client_concurrency: MaxClientConcurrency = Field(
        default=512,
        description="Requests one client (token or address) may have in flight (429 past it). The run's own "
        "clients share the cohort token: keep it above the aggregator's and evaluator's connections together.",
    )
    request_timeout_s: float = Field(default=120.0, gt=0.0, description="Backend time limit per request (503).")
    swap_timeout_s: float = Field(default=600.0, gt=0.0)
    batch: BatchingSettings = BatchingSettings()
    vllm: EngineOptions = Field(
        default_factory=EngineOptions, description="vLLM engine options (CORL_VLLM__GPU_MEMORY_UTILIZATION, ...)."
    )

    @property
    def member_name(self) -> str:
        if self.name:
            return self.name
        return self.model_dir.rstrip("/").rsplit("/", 1)[-1] if self.model_dir else "model"
