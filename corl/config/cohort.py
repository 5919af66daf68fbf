"""The cohort config's root: one model of the whole run, its sections, and the checks that span them."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from corl.proto import SamplingSettings

from .base import Name, _Section
from .gateway import GatewayConfig
from .members import MemberConfig
from .placement import PlacementConfig
from .reward import RewardConfig
from .rounds import RoundsConfig
from .sandbox import SandboxConfig
from .task import TaskConfig
from .tracking import TrackingConfig
from .training import TrainingConfig


class CohortConfig(_Section):
    run_id: Name = Field(
        default="tiny",
        description="Names the run: its Redis keys, its routes (/v1/runs/{run_id}/...), its trackers' runs.",
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="The run's Redis, which every process uses (a service's own redis_url setting overrides it).",
    )
    task: TaskConfig = Field(
        default=TaskConfig(),
        description="The task: its problems and how answers are read; `task: NAME` is short for `{name: NAME}`.",
    )
    weights_dir: str = Field(default="weights", description="Weights store (shared volume on Kubernetes).")
    checkpoints_dir: str = Field(default="checkpoints", description="Where the trainers write their checkpoints.")
    members: list[MemberConfig] = Field(min_length=2, description="The cohort: two or more members, names unique.")
    rounds: RoundsConfig = Field(default=RoundsConfig(), description="What one round asks of the members.")
    reward: RewardConfig = Field(default=RewardConfig(), description="How samples are rewarded.")
    training: TrainingConfig = Field(default=TrainingConfig(), description="The trainers' loss, optimizer, publishing.")
    tracking: TrackingConfig = Field(default=TrackingConfig(), description="Experiment trackers to report to.")
    sandbox: SandboxConfig = Field(default=SandboxConfig(), description="Where the code task's programs may run.")
    placement: PlacementConfig = Field(
        default=PlacementConfig(), description="How the run's processes share one node's GPUs (corl plan)."
    )
    gateway: GatewayConfig = Field(
        default=GatewayConfig(), description="The harvesting gateway: what it harvests, how new versions reach it."
    )

    @field_validator("task", mode="before")
    @classmethod
    def _task_by_name(cls, v: object) -> object:
        return {"name": v} if isinstance(v, str) else v  # `task: math` is short for `task: {name: math}`

    @model_validator(mode="after")
    def _check_members(self) -> CohortConfig:
        names = [m.name for m in self.members]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"member names must be unique, repeated: {dupes}")
        frozen_lr = [m.name for m in self.members if m.role == "frozen" and m.lr is not None]
        if frozen_lr:
            raise ValueError(f"frozen members do not train, so take no lr: {frozen_lr}")
        from corl.tasks import get_task

        generated = self.task.source is None and self.rounds.prompt_source.kind == "task"
        if generated and not get_task(self.task.name).generates:
            raise ValueError(f"task {self.task.name!r} has no generator: set task.source (e.g. packaged:gsm8k)")
        trained = {m.name for m in self.members if m.role == "trained"}
        bad = [f"{m.name} -> {m.teacher_of}" for m in self.members if m.teacher_of and m.teacher_of not in trained]
        if bad:
            raise ValueError(f"teacher_of must name a trained member: {bad}")
        teaching = [m.name for m in self.members if m.teacher_of and m.role != "frozen"]
        if teaching:
            raise ValueError(f"teachers are frozen members (role: frozen): {teaching}")
        if self.teachers() and not self.reward.reads_votes():
            raise ValueError(f"teachers vote; reward mode {self.reward.mode} reads no votes")
        if self.rounds.min_quorum > len(self.members):
            raise ValueError(f"rounds.min_quorum={self.rounds.min_quorum} exceeds the {len(self.members)} members")
        self._check_gateway(set(names), trained)
        return self

    def _check_gateway(self, names: set[str], trained: set[str]) -> None:
        gw = self.gateway
        unknown = sorted(set(gw.harvest.members or ()) - names)
        if unknown:
            raise ValueError(f"gateway.harvest.members names no member: {unknown}")
        canaried = sorted(set(gw.canary.stable) - {m.name for m in self.served_members() if m.name in trained})
        if canaried:
            raise ValueError(f"gateway.canary.stable: only trained members corl serves have versions: {canaried}")
        if self.rounds.prompt_source.kind == "harvest" and not gw.harvest.enabled:
            raise ValueError("rounds.prompt_source kind 'harvest' reads the gateway's pool: gateway.harvest.enabled")

    def teachers(self) -> dict[str, str]:
        """teacher -> the trained member it votes for."""
        return {m.name: m.teacher_of for m in self.members if m.teacher_of}

    def sampling(self) -> SamplingSettings:
        """The run's sampling settings: what every generate call asks for and every batch carries."""
        from corl.tasks import get_task

        rc, task = self.rounds, get_task(self.task.name)
        return SamplingSettings(
            temperature=rc.temperature,
            top_p=rc.top_p,
            max_tokens=rc.max_tokens if rc.max_tokens is not None else task.max_tokens,
            stop=list(rc.stop) if rc.stop is not None else list(task.stop),
        )

    def lr(self, member: str) -> float:
        """The member's learning rate: its own ``lr``, else ``training.lr``."""
        own = self.member(member).lr
        return self.training.lr if own is None else own

    def served_members(self) -> list[MemberConfig]:
        """Members served by corl model servers: every member but the outside endpoints."""
        return [m for m in self.members if m.endpoint is None]

    def member(self, name: str) -> MemberConfig:
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(f"no member {name!r} in run {self.run_id!r}; members: {[m.name for m in self.members]}")
