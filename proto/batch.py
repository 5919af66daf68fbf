"""A graded batch: what the aggregator appends to a member's Redis stream and its trainer consumes."""

from pydantic import Field

from ._base import WireModel
from .generate import FinishReason


class GradedSample(WireModel):
    sample_id: str
    group_id: str = Field(description="Prompt group: samples of one prompt share it (group-relative advantages).")
    prompt: str
    prompt_token_ids: list[int]
    response: str
    response_token_ids: list[int]
    logprobs: list[float] = Field(description="Sampling log-probs returned by the server, one per response token.")
    finish_reason: FinishReason
    weight_version: int = Field(ge=0, description="Weights the sample was generated with.")
    reward: float
    answer: str | None = Field(default=None, description="Canonical extracted answer (None if unparseable).")


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
    reward_mode: str
    created_at: float = Field(description="Unix time.")
    samples: list[GradedSample] = Field(min_length=1)
    diagnostics: BatchDiagnostics
