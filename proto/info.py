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
    task: str = Field(description="Task whose answer extraction the server uses for vote grading.")


class HealthResponse(WireModel):
    status: Literal["ok"] = "ok"


class ReadyResponse(WireModel):
    status: Literal["ready"] = "ready"
    weight_version: int = Field(ge=0)
