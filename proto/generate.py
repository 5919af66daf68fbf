"""``POST /v1/generate``: n samples per prompt with token ids and sampling log-probs."""

from typing import Annotated, Literal

from pydantic import Field

from ._base import WireModel

NonEmptyStr = Annotated[str, Field(min_length=1)]


class GenerateRequest(WireModel):
    """Sampling request. Server-side bounds (max prompts, n, max_tokens) are configured per server."""

    prompts: list[NonEmptyStr] = Field(min_length=1, description="Prompts, each non-empty.")
    n: int = Field(default=1, ge=1, description="Samples per prompt.")
    max_tokens: int = Field(default=16, ge=1, description="Maximum new tokens per sample.")
    temperature: float = Field(default=1.0, ge=0.0, description="0 means greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, description="Makes sampling reproducible for this request.")


FinishReason = Literal["stop", "length"]


class Sample(WireModel):
    text: str = Field(description="Decoded completion, without the end-of-sequence token.")
    token_ids: list[int] = Field(description="Sampled token ids, including the end token when finish_reason is 'stop'.")
    logprobs: list[float] = Field(
        description="Log-probability of each sampled token under the sampling distribution "
        "(after temperature and top-p), one per token id."
    )
    finish_reason: FinishReason


class PromptResult(WireModel):
    prompt: str
    prompt_token_ids: list[int] = Field(description="The prompt as the server tokenised it.")
    samples: list[Sample]


class GenerateResponse(WireModel):
    model: str = Field(description="Name of the cohort member that served the request.")
    weight_version: int = Field(ge=0, description="Weights that produced every sample in this response.")
    results: list[PromptResult] = Field(description="One entry per prompt, in request order.")
