"""The cohort config's ``training`` section: the trainers' loss, optimizer, publishing and checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Section
from .scale import DistributedConfig


class LoraConfig(_Section):
    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class TrainingConfig(_Section):
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = "grpo"
    lr: float = Field(default=5e-5, gt=0, description="AdamW learning rate (2e-4 made peer_label collapse here).")
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    scale_rewards: bool = True
    epsilon: float = Field(default=0.2, gt=0)
    epsilon_high: float | None = Field(default=None, gt=0, description="Upper clip (DAPO); None: epsilon.")
    beta: float = Field(default=0.0, ge=0, description="KL to the starting weights.")
    steps_per_batch: int = Field(default=1, ge=1)
    micro_batch_size: int | None = Field(
        default=None, ge=1, description="Sequences per forward/backward (gradient accumulation); None: whole batch."
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute activations in backward (less memory, ~30% more compute): for real members on CPU.",
    )
    publish_every: int = Field(default=1, ge=1)
    keep_versions: int = Field(default=3, ge=1)
    max_staleness: int = Field(default=3, ge=0, description="Drop batches generated more than K versions ago.")
    checkpoint_every: int = Field(default=5, ge=1)
    lora: LoraConfig | None = None
    seed: int = 0
    distributed: DistributedConfig = DistributedConfig()
