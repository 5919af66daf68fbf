"""The cohort config's ``training`` section: the trainers' loss, optimizer, publishing and checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Section
from .scale import DistributedConfig


class LoraConfig(_Section):
    r: int = Field(default=8, ge=1, description="LoRA rank.")
    alpha: int = Field(default=16, ge=1, description="LoRA alpha (the update is scaled by alpha / r).")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear", description="Modules that get an adapter (PEFT's target_modules)."
    )


class TrainingConfig(_Section):
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = Field(
        default="grpo", description="How token losses are averaged, with TRL's meaning of each name."
    )
    lr: float = Field(default=5e-5, gt=0, description="AdamW learning rate (2e-4 made peer_label collapse here).")
    betas: tuple[float, float] = Field(default=(0.9, 0.99), description="AdamW betas.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(default=1.0, gt=0, description="Gradient norm clipped to this.")
    scale_rewards: bool = Field(default=True, description="Divide a group's advantages by its reward std.")
    epsilon: float = Field(default=0.2, gt=0, description="Clip range of the ratio to the sampling policy.")
    epsilon_high: float | None = Field(default=None, gt=0, description="Upper clip (DAPO); None: epsilon.")
    beta: float = Field(default=0.0, ge=0, description="KL to the starting weights.")
    steps_per_batch: int = Field(default=1, ge=1, description="Optimizer steps on each batch.")
    micro_batch_size: int | None = Field(
        default=None, ge=1, description="Sequences per forward/backward (gradient accumulation); None: whole batch."
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute activations in backward (less memory, ~30% more compute): for real members on CPU.",
    )
    publish_every: int = Field(default=1, ge=1, description="Publish a weight version every this many steps.")
    weight_transfer: Literal["files", "broadcast"] = Field(
        default="broadcast",
        description="How a full-weight version reaches the member's servers. broadcast: over a torch.distributed "
        "group of the trainer and the replicas (gloo on CPU, NCCL on GPUs), all at once, checked per tensor; the "
        "files are written afterwards from a CPU copy, off the training path, and serve resume, late replicas and "
        "final/. Where the servers cannot join a group (or a LoRA adapter is published) it falls back to files. "
        "files: write, checksum, then each replica loads the files (the only path before).",
    )
    keep_versions: int = Field(default=3, ge=1, description="Published versions kept in the weights store.")
    max_staleness: int = Field(default=3, ge=0, description="Drop batches generated more than K versions ago.")
    checkpoint_every: int = Field(
        default=5, ge=1, description="Checkpoint (then acknowledge) after this many batches; also when idle."
    )
    lora: LoraConfig | None = Field(default=None, description="Train a LoRA adapter (published alone); None: all.")
    seed: int = Field(default=0, description="torch seed of each trainer.")
    distributed: DistributedConfig = Field(
        default=DistributedConfig(), description="How a trainer group (trainer_processes > 1) shares an update."
    )
