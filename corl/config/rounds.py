"""The cohort config's ``rounds`` section: what one round asks of the members, and its back-pressure."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import _Section


class PromptSource(_Section):
    kind: Literal["task", "jsonl", "http", "harvest"] = Field(
        default="task",
        description="task: the task's split; jsonl: a file; http: what POST /v1/prompts adds; harvest: the newest "
        "conversations the gateway harvested (gateway.harvest), each taken once.",
    )
    path: str | None = Field(default=None, description="JSONL of {prompt, answer?} records (kind=jsonl).")
    split: Literal["rl", "eval"] = Field(default="rl", description="kind=task: the RL split or the held-out one.")
    seed: int = Field(default=0, description="Seed of the task's RL / held-out split.")
    min_prompts: int = Field(
        default=1,
        ge=1,
        description="kind=harvest: a round waits until this many new conversations are in the pool (at most "
        "prompts_per_round of the newest are taken; older ones a round passes over are not trained on).",
    )

    @model_validator(mode="after")
    def _path_for_jsonl(self) -> PromptSource:
        if self.kind == "jsonl" and not self.path:
            raise ValueError("prompt source kind 'jsonl' needs a path")
        return self


class RoundsConfig(_Section):
    prompts_per_round: int = Field(default=16, ge=1, description="Prompts every member answers in one round.")
    samples_per_prompt: int = Field(default=8, ge=2, description="G: samples per prompt and member.")
    max_tokens: int | None = Field(default=None, ge=1, description="New tokens per sample; None: the task's default.")
    temperature: float = Field(default=1.0, gt=0.0, description="Sampling temperature of the rewarded samples.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    stop: list[str] | None = Field(default=None, description="Stop strings; None: the task's.")
    prompt_source: PromptSource = Field(default=PromptSource(), description="Where the RL prompts come from.")
    max_pending_batches: int = Field(
        default=2, ge=1, description="Back-pressure: batches per member stream not yet delivered to its trainer."
    )
    backpressure: Literal["wait", "skip"] = Field(
        default="wait",
        description="wait: hold the next round until no trainer is full (max_pending_batches); skip: go without them.",
    )
    min_quorum: int = Field(default=2, ge=2, description="Members needed for a round to produce rewards.")
    request_timeout_s: float = Field(default=60.0, gt=0, description="Bound on one request to a member.")
    max_rounds: int | None = Field(default=None, ge=1, description="Stop after this many rounds (None: run on).")
