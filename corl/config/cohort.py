"""The cohort config: one YAML file describes a run and is read by every process of it.

Tokens never live in the file; they come from the environment (``CORL_ADMIN_TOKEN``).
Relative paths are resolved against the file's directory. ``load_config`` reports every wrong
field at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from corl.proto import SamplingSettings

from .base import Name, _Section
from .endpoint import EndpointConfig as EndpointConfig  # outside OpenAI-compatible members
from .reward import JudgeConfig as JudgeConfig  # the reward section, re-exported
from .reward import ReliabilityConfig as ReliabilityConfig
from .reward import RewardConfig
from .reward import VoteConfig as VoteConfig
from .sandbox import SandboxConfig
from .scale import DistributedConfig as DistributedConfig  # members larger than one device
from .scale import MemberVllm
from .tracking import TrackingConfig


class MemberConfig(_Section):
    """A member served by corl model servers (``model`` + ``servers``), or an outside ``endpoint``
    (always frozen: it votes and grades, it never trains)."""

    name: Name
    model: str | None = Field(default=None, description="Model directory (save_pretrained layout) or hub name.")
    servers: list[str] = Field(default_factory=list, description="Base URLs of the member's server replicas.")
    endpoint: EndpointConfig | None = Field(
        default=None, description="An outside OpenAI-compatible server instead of model and servers."
    )
    role: Literal["trained", "frozen"] = "trained"
    backend: Literal["transformers", "vllm"] = "transformers"
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


class PromptSource(_Section):
    kind: Literal["task", "jsonl", "http"] = "task"
    path: str | None = Field(default=None, description="JSONL of {prompt, answer?} records (kind=jsonl).")
    split: Literal["rl", "eval"] = "rl"
    seed: int = 0

    @model_validator(mode="after")
    def _path_for_jsonl(self) -> PromptSource:
        if self.kind == "jsonl" and not self.path:
            raise ValueError("prompt source kind 'jsonl' needs a path")
        return self


class TaskConfig(_Section):
    """The run's task: how prompts are presented, how answers are read; configured only here."""

    name: str = Field(default="addition", description="Task plug-in: addition, math, code.")
    source: str | None = Field(
        default=None,
        description="Problems: packaged:gsm8k|champ|humaneval, gym:<reasoning-gym generator>, or a local "
        ".jsonl/.json/.parquet file or save_to_disk directory (relative to this file); None: the task's generator.",
    )
    eval_fraction: float = Field(default=0.2, ge=0.0, lt=1.0, description="Share of the problems held out.")
    eval_size: int | None = Field(default=None, ge=0, description="Problems held out (overrides eval_fraction).")
    limit: int | None = Field(default=None, ge=2, description="Use only this many problems (after shuffling).")
    size: int = Field(default=1000, ge=2, description="Problems a gym: generator makes.")
    options: dict[str, Any] = Field(default_factory=dict, description="A gym: generator's config fields.")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from corl.tasks import task_names

        if v not in task_names():
            raise ValueError(f"unknown task {v!r}; known: {task_names()}")
        return v

    @field_validator("source")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        if v is not None:
            from corl.data.sources import parse_source

            parse_source(v)
        return v

    def is_file(self) -> bool:
        from corl.data.sources import parse_source

        return self.source is not None and parse_source(self.source)[0] == "file"


class RoundsConfig(_Section):
    prompts_per_round: int = Field(default=16, ge=1)
    samples_per_prompt: int = Field(default=8, ge=2)
    max_tokens: int | None = Field(default=None, ge=1, description="New tokens per sample; None: the task's default.")
    temperature: float = Field(default=1.0, gt=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: list[str] | None = Field(default=None, description="Stop strings; None: the task's.")
    prompt_source: PromptSource = PromptSource()
    max_pending_batches: int = Field(
        default=2, ge=1, description="Back-pressure: batches per member stream not yet delivered to its trainer."
    )
    backpressure: Literal["wait", "skip"] = Field(
        default="wait",
        description="wait: hold the next round until every trainer is below max_pending_batches; "
        "skip: produce it without the members that are full.",
    )
    min_quorum: int = Field(default=2, ge=2, description="Members needed for a round to produce rewards.")
    request_timeout_s: float = Field(default=60.0, gt=0)
    max_rounds: int | None = Field(default=None, ge=1, description="Stop after this many rounds (None: run on).")


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


class CohortConfig(_Section):
    run_id: Name = "tiny"
    redis_url: str = "redis://127.0.0.1:6379/0"
    task: TaskConfig = TaskConfig()
    weights_dir: str = Field(default="weights", description="Weights store (shared volume on Kubernetes).")
    checkpoints_dir: str = "checkpoints"
    members: list[MemberConfig] = Field(min_length=2)
    rounds: RoundsConfig = RoundsConfig()
    reward: RewardConfig = RewardConfig()
    training: TrainingConfig = TrainingConfig()
    tracking: TrackingConfig = TrackingConfig()
    sandbox: SandboxConfig = SandboxConfig()

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
        return self

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


class ConfigError(ValueError):
    """A config file that cannot be used; the message lists every problem."""


def _format_errors(err: ValidationError) -> str:
    lines = [f"{len(err.errors())} problem(s) in the cohort config:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        lines.append(f"  - {loc}: {e['msg']}")
    return "\n".join(lines)


def parse_config(data: object, base_dir: Path | None = None) -> CohortConfig:
    try:
        cfg = CohortConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None
    return _resolve_paths(cfg, base_dir) if base_dir else cfg


def load_config(path: str | Path) -> CohortConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read cohort config {path}: {err}") from None
    return parse_config(data, path.resolve().parent)


def dump_config(cfg: CohortConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


def _resolve(p: str, base: Path) -> str:
    if "://" in p:
        return p
    q = Path(p).expanduser()
    if q.is_absolute():
        return str(q)
    resolved = base / q
    # A relative name that is not a local path may be a hub id ("org/model"): keep it as given.
    return str(resolved) if resolved.exists() or not _looks_like_hub_id(p) else p


def _looks_like_hub_id(p: str) -> bool:
    return p.count("/") == 1 and not p.startswith(".")


def _resolve_dir(p: str | None, base: Path) -> str | None:
    return None if p is None else str((base / Path(p).expanduser()).resolve())


def _resolve_paths(cfg: CohortConfig, base: Path) -> CohortConfig:
    members = [m if m.model is None else m.model_copy(update={"model": _resolve(m.model, base)}) for m in cfg.members]
    src = cfg.rounds.prompt_source
    if src.path:
        src = src.model_copy(update={"path": str((base / src.path).resolve())})
    task = cfg.task
    if task.source is not None and task.is_file():
        task = task.model_copy(update={"source": str((base / Path(task.source).expanduser()).resolve())})
    return cfg.model_copy(
        update={
            "task": task,
            "members": members,
            "weights_dir": str((base / cfg.weights_dir).resolve()),
            "checkpoints_dir": str((base / cfg.checkpoints_dir).resolve()),
            "rounds": cfg.rounds.model_copy(update={"prompt_source": src}),
            "tracking": cfg.tracking.model_copy(update={"dir": _resolve_dir(cfg.tracking.dir, base)}),
        }
    )
