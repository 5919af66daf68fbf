"""The cohort config's ``members`` entries: a model corl serves, or an outside OpenAI-compatible endpoint."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .base import Name, _Section
from .endpoint import EndpointConfig
from .placement import MemberTrainer
from .scale import MemberVllm


class MemberConfig(_Section):
    """A member served by corl model servers (``model`` + ``servers``), or an outside ``endpoint``
    (always frozen: it votes and grades, it never trains)."""

    name: Name = Field(description="The member's name in the run: its stream, metrics label and OpenAI model name.")
    model: str | None = Field(
        default=None,
        description="Model directory (save_pretrained layout) or Hugging Face Hub id org/name[@revision], "
        "which corl run resolves once and pins to a commit (hub.json in the run directory).",
    )
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
    gpus: int | None = Field(
        default=None,
        ge=0,
        description="GPUs of each of the member's servers, and of its trainer unless trainer.gpus is set (as in "
        "the Helm chart): a vLLM server shards the model over them (tensor_parallel_size), a trainer runs one "
        "process per GPU (trainer_processes). 0: the CPU; None: corl plan places it on what is left.",
    )
    trainer: MemberTrainer = Field(
        default_factory=MemberTrainer, description="The member's trainer, where it differs from its servers."
    )

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

    @model_validator(mode="after")
    def _gpus_fit(self) -> MemberConfig:
        """``gpus`` and ``trainer.gpus`` set what they imply (a vLLM server's tensor-parallel size, a
        trainer's processes) and refuse a config that says otherwise."""
        if self.endpoint is not None and (self.gpus is not None or self.trainer.gpus is not None):
            raise ValueError(f"member {self.name!r} is an outside endpoint: corl places no process of it (no gpus)")
        if self.role != "trained" and self.trainer.gpus is not None:
            raise ValueError(f"member {self.name!r} is not trained: it has no trainer to give GPUs")
        if self.gpus is not None and self.gpus > 1 and self.backend != "vllm":
            raise ValueError(
                f"member {self.name!r}: a transformers server uses one GPU; gpus: {self.gpus} needs backend: vllm "
                "(tensor parallel), or set trainer.gpus for a larger trainer"
            )
        if self.gpus is not None and self.gpus >= 1 and self.backend == "vllm":
            tp = self.vllm.tensor_parallel_size
            if "tensor_parallel_size" in self.vllm.model_fields_set and tp != self.gpus:
                raise ValueError(f"member {self.name!r}: gpus: {self.gpus} but vllm.tensor_parallel_size: {tp}")
            if tp != self.gpus:
                self.vllm = self.vllm.model_copy(update={"tensor_parallel_size": self.gpus})
        trainer_gpus = self.trainer_gpus()
        if self.role == "trained" and trainer_gpus:
            n = self.trainer_processes
            if "trainer_processes" in self.model_fields_set and n != trainer_gpus:
                raise ValueError(
                    f"member {self.name!r}: trainer_processes: {n} on {trainer_gpus} GPU(s); a trainer group runs "
                    "one process per GPU (drop trainer_processes: the GPUs set it)"
                )
            self.trainer_processes = trainer_gpus
        return self

    def trainer_gpus(self) -> int | None:
        """GPUs asked for the member's trainer: ``trainer.gpus``, else the member's ``gpus`` (None: not asked)."""
        return self.trainer.gpus if self.trainer.gpus is not None else self.gpus

    def server_gpus(self) -> int | None:
        """GPUs asked for each of the member's servers: ``gpus``, else a vLLM tensor-parallel size above 1."""
        if self.gpus is not None:
            return self.gpus
        tp = self.vllm.tensor_parallel_size
        return tp if self.backend == "vllm" and tp > 1 else None

    @property
    def is_endpoint(self) -> bool:
        return self.endpoint is not None

    def model_path(self) -> str:
        """The model corl serves for this member (every member but an outside endpoint has one)."""
        if self.model is None:
            raise ValueError(f"member {self.name!r} is an outside endpoint: corl serves no model for it")
        return self.model
