"""Held-out accuracy: one reading of a member (as the run's evaluator records it in Redis and the
aggregator's stats carry it), and the evaluator's ``GET /v1/runs/{run}/heldout``."""

from __future__ import annotations

from pydantic import Field

from ._base import WireModel


class HeldoutAccuracy(WireModel):
    """A member's greedy accuracy on the task's held-out split, measured through its own server."""

    accuracy: float = Field(ge=0.0, le=1.0, description="Share of the held-out problems answered right (greedy).")
    weight_version: int = Field(ge=0, description="Weight version the server answered with.")
    parsed: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Share of the greedy answers the task's reader takes (None: not read).",
    )
    formatted: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Share of the greedy answers in the form the task asks for."
    )
    at: float = Field(description="Unix time the reading was taken.")


class HeldoutReadings(WireModel):
    """What the evaluator (``corl serve evaluator``) has read: the latest reading of each member."""

    run_id: str
    eval_every: int = Field(ge=1, description="A member is read again once its weights are this many versions on.")
    eval_prompts: int = Field(ge=0, description="Held-out problems per reading.")
    members: dict[str, HeldoutAccuracy] = Field(description="Latest reading per member (absent: none yet).")
