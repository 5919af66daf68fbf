"""A graded batch: what the aggregator appends to a member's Redis stream and its trainer consumes.

It carries what produced it: the sampling settings of the round, and each prompt once per group
(with the member's own token ids), its samples below it.
"""

from typing import Annotated

from pydantic import Field

from ._base import WireModel
from .generate import FinishReason, SamplingSettings
from .modes import RewardModeName

# What a trainer steps on must be finite: a NaN reward or log-prob (JSON allows neither, Python's
# encoder writes both) would poison the update, so a batch carrying one fails validation and is dropped.
TokenId = Annotated[int, Field(ge=0)]
LogProb = Annotated[float, Field(le=1e-3, allow_inf_nan=False)]  # <= 0, with room for a backend's rounding


class GradedSample(WireModel):
    sample_id: str
    response: str
    response_token_ids: list[TokenId]
    logprobs: list[LogProb] = Field(description="Sampling log-probs returned by the server, one per response token.")
    finish_reason: FinishReason
    weight_version: int = Field(ge=0, description="Weights the sample was generated with.")
    reward: float = Field(allow_inf_nan=False)
    answer: str | None = Field(default=None, description="Canonical extracted answer (None if unparseable).")


class PromptGroup(WireModel):
    """One prompt and the member's samples of it (group-relative advantages are taken per group)."""

    group_id: str
    prompt: str = Field(description="Task text of the prompt.")
    prompt_token_ids: list[TokenId] = Field(min_length=1, description="The prompt as the member's server rendered it.")
    samples: list[GradedSample] = Field(min_length=1)
    weight: float = Field(
        default=1.0,
        ge=0.0,
        allow_inf_nan=False,
        description="Scales the group's advantages (a reward mode's confidence in the prompt).",
    )


class BatchDiagnostics(WireModel):
    mean_reward: float
    label_rate: float = Field(ge=0.0, le=1.0, description="Fraction of prompts that received a peer label.")
    distinct_answers: float = Field(ge=0.0, description="Mean distinct valid answers per G samples.")
    answer_entropy: float = Field(ge=0.0, description="Mean entropy (nats) of the answer distribution per prompt.")
    mean_response_tokens: float = Field(ge=0.0)


class GradedBatch(WireModel):
    batch_id: str = Field(description="Deterministic id (run, round, member): a retried round adds no duplicate.")
    run_id: str
    round: int = Field(ge=0)
    member: str
    reward_mode: RewardModeName
    created_at: float = Field(description="Unix time.")
    sampling: SamplingSettings = Field(description="The settings every sample of the batch was drawn with.")
    groups: list[PromptGroup] = Field(min_length=1)
    diagnostics: BatchDiagnostics

    def samples(self) -> list[tuple[PromptGroup, GradedSample]]:
        """Every sample with its group, in batch order."""
        return [(g, s) for g in self.groups for s in g.samples]
