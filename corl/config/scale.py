"""Members larger than one device: a member's trainer group (torch.distributed) and the vLLM
engine options of its servers (tensor parallelism)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Section


class DistributedConfig(_Section):
    """How a member's trainer group (``trainer_processes`` > 1) shares one update, on torch.distributed."""

    strategy: Literal["ddp", "fsdp2"] = Field(
        default="ddp",
        description="ddp: every rank holds the whole model, gradients are all-reduced; fsdp2: parameters, "
        "gradients and optimizer state sharded (torch.distributed.fsdp.fully_shard).",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(default="auto", description="auto: nccl on GPUs, else gloo.")
    mixed_precision: Literal["none", "bf16", "fp16"] = Field(
        default="none", description="fsdp2: compute dtype of the sharded parameters (gradients reduced in fp32)."
    )
    cpu_offload: bool = Field(default=False, description="fsdp2: keep sharded parameters and optimizer state on CPU.")


class MemberVllm(_Section):
    """vLLM engine options of one member's servers (backend: vllm); the deployment gives each server
    ``tensor_parallel_size`` GPUs."""

    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs one server shards the model over.")
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.0, le=1.0, description="Share of each GPU's memory vLLM takes; None: the server's setting."
    )
    max_model_len: int | None = Field(default=None, ge=1, description="None: the model config's context length.")
