"""Where a run's processes go on one node: a member's GPUs (``gpus``, ``trainer.gpus``) and the
run's ``placement`` section. ``corl plan`` turns them and the node into a device plan
(``corl.placement``)."""

from __future__ import annotations

from pydantic import Field

from .base import _Section


class MemberTrainer(_Section):
    """A trained member's trainer, where it differs from the member's servers."""

    gpus: int | None = Field(
        default=None,
        ge=0,
        description="GPUs of the member's trainer, one process each (trainer_processes follows); 0: the CPU; "
        "None: the member's gpus.",
    )


class PlacementConfig(_Section):
    """How ``corl run`` shares one node's GPUs among the run's processes."""

    colocate: bool = Field(
        default=False,
        description="Each trained member's trainer runs on its (first) server's GPUs instead of GPUs of its own: "
        "one set of GPUs per member instead of two.",
    )
    server_memory_share: float = Field(
        default=0.5,
        gt=0.0,
        lt=1.0,
        description="Share of a GPU's memory the vLLM servers on it take (split among them) where a trainer or a "
        "transformers server shares the GPU; alone on their GPUs they take 0.9. A member's own "
        "vllm.gpu_memory_utilization wins.",
    )
