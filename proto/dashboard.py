"""``GET /v1/runs/{run}/dashboard``: what the live dashboard (``GET /dashboard``) polls."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import WireModel
from .endpoints import EndpointStats
from .grading import RoundStats
from .weights import WeightTransfer


class MemberView(WireModel):
    name: str
    role: Literal["trained", "frozen"]
    weight_version: int | None = Field(description="Served by the member's first replica now (None: unreachable).")
    mean_reward: float | None = Field(description="Last round's mean reward (None: not in the last round).")
    label_rate: float | None = Field(description="Last round's labelled fraction of prompts.")
    distinct_answers: float | None = Field(description="Last round's mean distinct answers per G samples.")
    pseudo_label_accuracy: float | None = Field(description="Last round's pseudo-label accuracy (diagnostic).")
    heldout_accuracy: float | None = Field(description="Latest held-out accuracy reported by the run's evaluator.")
    heldout_version: int | None = Field(description="Weight version of that held-out accuracy.")
    backlog: int | None = Field(description="Batches in the member's stream not yet delivered (None: frozen).")
    collapse: bool = Field(description="The member's collapse alarm is raised.")
    label_share: float | None = Field(
        default=None, description="Last round's share of the other members' labels equal to its answer."
    )
    weight_transfer: WeightTransfer | None = Field(
        default=None, description="How its new versions reach its servers: broadcast or files (None: none yet)."
    )
    endpoint: EndpointStats | None = Field(
        default=None, description="An outside endpoint member's counters (None: a member corl serves)."
    )


class DashboardView(WireModel):
    run_id: str
    next_round: int = Field(ge=0)
    updated_at: float = Field(description="Unix time this view was built.")
    members: list[MemberView]
    rounds: list[RoundStats] = Field(description="Most recent rounds, oldest first (the charts' series).")
    grader_weights: dict[str, float]
    quarantined: list[str]
    collapse: list[str] = Field(description="Members whose collapse alarm is raised.")
