"""``POST /v1/grade``: score (prompt, response) pairs in [0, 1].

This is also the contract an external grading agent implements (push mode) in any language. The
request names the task, so a grader reads answers and builds judge texts the task's way, and
says how prompts are presented (``format``) and how vote samples are drawn (``sampling``): a
model server keeps no task setting of its own.
"""

from typing import Annotated, Literal

from pydantic import Field

from ._base import WireInt, WireModel, WireRequest
from .generate import PromptFormat, SamplingSettings

Score = Annotated[float, Field(ge=0.0, le=1.0)]
Share = Annotated[float, Field(ge=0.0, le=1.0)]  # a share of samples, answers or labels
# A judge's rubric: what a free-form response is checked against (the chat task's judge text).
Rubric = Annotated[str, Field(min_length=1, max_length=4000)]


class GradeItem(WireRequest):
    prompt: str = Field(min_length=1, description="Task text of the prompt.")
    response: str


GradeMode = Literal["vote", "judge"]


class GradeRequest(WireRequest):
    """``vote``: the grader samples ``n_votes`` answers of its own to the prompt (with ``sampling``)
    and the score is the fraction that agree with the response's extracted answer. ``judge``: the
    grader reads the task's judge text for (prompt, response), rendered with ``format``, and the
    score is its probability of the task's "correct" verdict token."""

    items: list[GradeItem] = Field(min_length=1)
    task: str = Field(min_length=1, description="Task plug-in (addition, math, code): answers and judge texts.")
    mode: GradeMode = "vote"
    n_votes: WireInt = Field(default=8, ge=1)
    format: PromptFormat = Field(default_factory=PromptFormat)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings, description="Vote mode only.")
    rubric: Rubric | None = Field(
        default=None,
        description="Judge mode, a task that reads one (chat): what the response is judged against (the "
        "cohort config's task.rubric); None: the task's own.",
    )


class GradeResponse(WireModel):
    model: str = Field(description="Name of the grader.")
    weight_version: int = Field(ge=0, description="Weights that produced the scores (0 for agents without versions).")
    scores: list[Score] = Field(description="One score per item, in request order.")
