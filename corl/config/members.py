"""The cohort config's ``members`` entries: a model corl serves, or an outside OpenAI-compatible endpoint."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .base import Name, _Section
from .endpoint import EndpointConfig
from .scale import MemberVllm


class MemberConfig(_Section):
    """A member served by corl model servers (``model`` + ``servers``), or an outside ``endpoint``
    (always frozen: it votes and grades, it never trains)."""

    name: Name = Field(description="The member's name in the run: its stream, metrics label and OpenAI model name.")
    model: str | None = Field(default=None, description="Model directory (save_pretrained layout) or hub name.")
    servers: list[str] = Field(default_factory=list, description="Base URLs of the member's server replicas.")
    endpoint: EndpointConfig | None = Field(
        default=None, description="An outside OpenAI-compatible server instead of model and servers."
    )
    role: Literal["trained", "frozen"] = Field(
        default="trained", description="trained: a trainer updates it; frozen: it votes and grades, never trains."
    )
    backend: Literal["transformers", "vllm"] = Field(
        default="transformers", description="Inference backend of its model servers."
    )
    lr: float | None = Field(
        default=None, gt=0, description="This member's learning rate (families differ in how far one step moves them)."
    )
    teacher_of: Name | None = Field(
        default=None,
        description="Frozen only: this member (e.g. a trained member's starting weights) votes for that trained "
        "member alone, beside its peers and never without them; it supervises no one else.",
    )
    trainer_processes: int = Field(
        default=1,
        ge=1,
        description="Processes in the member's trainer group (torchrun --nproc-per-node; one device each); "
        "more than 1 shards the update under training.distributed.strategy.",
    )
    vllm: MemberVllm = Field(default_factory=MemberVllm, description="vLLM engine options (backend: vllm).")

    @model_validator(mode="before")
    @classmethod
    def _endpoints_default_frozen(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("endpoint") is not None and "role" not in data:
            return {**data, "role": "frozen"}
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> MemberConfig:
        if self.endpoint is None:
            if self.model is None or not self.servers:
                raise ValueError(f"member {self.name!r} needs a model and at least one server, or an endpoint")
            return self
        if self.role == "trained":
            raise ValueError(f"member {self.name!r} is an outside endpoint: it never trains (role must be frozen)")
        # Checked by value, not by the fields given: a dumped config (model: null, servers: []) reads back.
        served = [k for k, v in (("model", self.model), ("servers", self.servers)) if v] + (
            ["backend"] if self.backend != "transformers" else []
        )
        if served:
            raise ValueError(f"member {self.name!r} is an outside endpoint: it takes no {served}")
        return self

    @model_validator(mode="after")
    def _scale_fits_role(self) -> MemberConfig:
        if self.trainer_processes > 1 and self.role != "trained":
            raise ValueError(f"member {self.name!r} is not trained: trainer_processes must be 1")
        if self.vllm != MemberVllm() and self.backend != "vllm":
            raise ValueError(f"member {self.name!r}: vllm options need backend: vllm")
        return self

    @property
    def is_endpoint(self) -> bool:
        return self.endpoint is not None

    def model_path(self) -> str:
        """The model corl serves for this member (every member but an outside endpoint has one)."""
        if self.model is None:
            raise ValueError(f"member {self.name!r} is an outside endpoint: corl serves no model for it")
        return self.model
