"""``GET /v1/info``, ``/healthz`` and ``/readyz``."""

from typing import Literal

from pydantic import Field

from ._base import WireModel


class InfoResponse(WireModel):
    name: str
    family: str = Field(description="Model family (config.model_type), e.g. gpt2, llama, qwen2, mamba.")
    parameters: int = Field(ge=0)
    weight_version: int = Field(ge=0)
    backend: str
    chat_template: bool = Field(description="Whether the member's tokenizer has a chat template.")
    max_context: int | None = Field(default=None, ge=1, description="Prompt + new tokens the model accepts.")


class HealthResponse(WireModel):
    status: Literal["ok"] = "ok"


class ReadyResponse(WireModel):
    status: Literal["ready"] = "ready"
    weight_version: int = Field(ge=0)
