"""``POST /v1/grade``: score (prompt, response) pairs in [0, 1].

This is also the contract an external grading agent implements (push mode) in any language.
"""

from typing import Annotated, Literal

from pydantic import Field

from ._base import WireModel

Score = Annotated[float, Field(ge=0.0, le=1.0)]


class GradeItem(WireModel):
    prompt: str = Field(min_length=1)
    response: str


GradeMode = Literal["vote", "judge"]


class GradeRequest(WireModel):
    """``vote``: the grader samples ``n_votes`` answers of its own to the prompt and the score is the
    fraction that agree with the response's extracted answer. ``judge``: the grader reads prompt and
    response in a judge template and the score is its probability of the "correct" verdict."""

    items: list[GradeItem] = Field(min_length=1)
    mode: GradeMode = "vote"
    n_votes: int = Field(default=8, ge=1)


class GradeResponse(WireModel):
    model: str = Field(description="Name of the grader.")
    weight_version: int = Field(ge=0, description="Weights that produced the scores (0 for agents without versions).")
    scores: list[Score] = Field(description="One score per item, in request order.")
