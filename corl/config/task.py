"""The cohort config's ``task`` section: which task plug-in, and where its problems come from."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from corl.proto.grade import Rubric

from .base import _Section


class TaskConfig(_Section):
    """The run's task: how prompts are presented, how answers are read; configured only here."""

    name: str = Field(default="addition", description="Task plug-in: addition, arith, math, code, chat.")
    source: str | None = Field(
        default=None,
        description="Problems: packaged:gsm8k|champ|humaneval, gym:<reasoning-gym generator>, "
        "hf:<org>/<name>[:<config>][@<split>] (a Hugging Face Hub data set), or a local .jsonl/.json/.parquet "
        "file or save_to_disk directory (relative to this file); None: the task's generator.",
    )
    eval_fraction: float = Field(default=0.2, ge=0.0, lt=1.0, description="Share of the problems held out.")
    eval_size: int | None = Field(default=None, ge=0, description="Problems held out (overrides eval_fraction).")
    limit: int | None = Field(default=None, ge=2, description="Use only this many problems (after shuffling).")
    size: int = Field(default=1000, ge=2, description="Problems a gym: generator makes.")
    options: dict[str, Any] = Field(default_factory=dict, description="A gym: generator's config fields.")
    rubric: Rubric | None = Field(
        default=None,
        description="chat task: what peer_judge's judges check a response against (the judge text's rubric); "
        "None: the task's default rubric.",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from corl.tasks import task_names

        if v not in task_names():
            raise ValueError(f"unknown task {v!r}; known: {task_names()}")
        return v

    @model_validator(mode="after")
    def _rubric_read(self) -> TaskConfig:
        from corl.tasks import reads_rubric

        if self.rubric is not None and not reads_rubric(self.name):
            raise ValueError(f"task {self.name!r} reads no rubric (rubric is the chat task's judge text)")
        return self

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
