"""The aggregator's own wire models: prompts posted to a run, the grading pool, and run statistics.

External grading agents implement ``/v1/grade`` (``proto.grade``) in push mode, or long-poll
``GET /v1/grading/tasks`` and post ``GradingResults`` in pull mode.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from ._base import WireModel, WireRequest
from .endpoints import EndpointStats
from .gateway import HarvestStats
from .grade import GradeMode, Score, Share
from .heldout import HeldoutAccuracy
from .weights import WeightTransfer

GraderName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")]


class PromptRecord(WireRequest):
    """One prompt of a JSONL prompt file or of ``POST /v1/prompts``."""

    prompt: str = Field(min_length=1)
    answer: str | None = Field(default=None, description="Dataset answer: diagnostics only, never a reward.")


class PromptsPost(WireRequest):
    prompts: list[PromptRecord] = Field(min_length=1)


class PromptsAccepted(WireModel):
    accepted: int = Field(ge=0)
    queued: int = Field(ge=0, description="Posted prompts not yet taken by a round.")


GraderMode = Literal["push", "pull"]


class GraderRegistration(WireRequest):
    """``POST /v1/graders`` (admin token): push agents give the base URL of their ``/v1/grade``."""

    # The rule of ``_url_for_push``, published: a push grader has a url, a pull grader none.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"mode": {"const": "push"}}},
            "then": {"required": ["url"], "properties": {"url": {"type": "string"}}},
            "else": {"properties": {"url": {"type": "null"}}},
        }
    )

    name: GraderName
    mode: GraderMode
    url: str | None = Field(default=None, min_length=1, description="Base URL of POST /v1/grade (push mode).")

    @model_validator(mode="after")
    def _url_for_push(self) -> GraderRegistration:
        if self.mode == "push" and not self.url:
            raise ValueError("push mode needs a url")
        if self.mode == "pull" and self.url:
            raise ValueError("pull mode takes no url")
        return self


class GraderRegistered(WireModel):
    name: str
    mode: GraderMode
    token: str = Field(description="Bearer token for this grader; shown once, stored only as a sha256 hash.")
    weight: float = Field(ge=0.0, le=1.0, description="Starting (probation) weight.")


class GradingTask(WireModel):
    task_id: str
    prompt: str
    response: str
    mode: GradeMode = "judge"
    deadline: float = Field(description="Unix time after which a result is ignored.")


class GradingTasks(WireModel):
    tasks: list[GradingTask]


class GradingResult(WireRequest):
    task_id: str = Field(min_length=1)
    score: Score


class GradingResults(WireRequest):
    results: list[GradingResult] = Field(min_length=1)


class GradingResultsAccepted(WireModel):
    accepted: int = Field(ge=0)
    ignored: int = Field(ge=0, description="Duplicate or late results (idempotent no-ops).")


class MemberRoundStats(WireModel):
    mean_reward: float
    label_rate: float = Field(ge=0.0, le=1.0)
    distinct_answers: float = Field(ge=0.0)
    answer_entropy: float = Field(ge=0.0)
    mean_response_tokens: float = Field(ge=0.0)
    pseudo_label_accuracy: float | None = Field(
        default=None, description="The member's own plurality vs dataset answers; diagnostic."
    )
    label_accuracy: float | None = Field(
        default=None, description="The supervision label vs dataset answers (TTRL's label accuracy); diagnostic."
    )
    reward_accuracy: float | None = Field(
        default=None, description="Share of samples rewarded exactly when right (TTRL's reward accuracy); diagnostic."
    )
    majority_ratio: Share | None = Field(default=None, description="Share of G samples that give the plurality answer.")
    label_share: Share | None = Field(
        default=None,
        description="Share of the labels given to the other members this round that equal this member's "
        "pseudo-label: how often its answer was the label (None: no other member got a label).",
    )
    echo_share: Share | None = Field(
        default=None, description="Share of valid answers copied from the prompt (a collapse signal)."
    )
    formatted_share: Share | None = Field(
        default=None, description="Share of samples in the form the task asks for (a collapse signal)."
    )
    batch_written: bool = Field(
        description="False when back-pressure, a frozen role or the collapse guard's hold held it back."
    )


class RoundStats(WireModel):
    round: int = Field(ge=0)
    created_at: float
    members: dict[str, MemberRoundStats] = Field(description="Members that answered this round.")
    missing: list[str] = Field(description="Members left out (down, timed out).")
    agreement: dict[str, dict[str, float]] = Field(description="Pseudo-label agreement between members.")
    cohort_diversity: float = Field(
        ge=0.0, le=1.0, description="Distinct pseudo-labels across members per prompt / members (1: all differ)."
    )
    harvested: list[str] = Field(
        default_factory=list,
        description="Pool ids of the harvested conversations that were this round's prompts (prompt source harvest).",
    )


class RunStats(WireModel):
    run_id: str
    next_round: int = Field(ge=0)
    rounds: list[RoundStats] = Field(description="Most recent rounds, oldest first.")
    grader_weights: dict[str, float]
    quarantined: list[str]
    collapse: list[str] = Field(description="Members whose collapse guard has tripped (held, with action: hold).")
    endpoints: dict[str, EndpointStats] = Field(
        default_factory=dict, description="Outside endpoint members: requests, tokens, latency, verdict sources."
    )
    heldout: dict[str, HeldoutAccuracy] = Field(
        default_factory=dict,
        description="Latest held-out accuracy per member, as the run's evaluator read it through the member's "
        "server (absent: not read yet; outside endpoints are not read).",
    )
    weight_transfer: dict[str, WeightTransfer] = Field(
        default_factory=dict,
        description="How each trained member's new versions reach its servers, as its trainer last recorded it: "
        "broadcast (its weight group) or files (absent: no version published yet).",
    )
    harvest: HarvestStats | None = Field(
        default=None,
        description="The gateway's harvest counters (prompt source harvest; None: the run reads no harvested prompts).",
    )
