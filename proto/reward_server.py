"""The cohort as a reward server for outside trainers: the request and response bodies of
``POST /get_reward`` (OpenRLHF's remote reward protocol) and ``POST /v1/reward`` (slime's
``remote_rm``), exactly as those clients send them.

OpenRLHF's ``remote_rm_fn`` posts ``{"query", "prompts", "labels"}`` (``query``: prompt and
response as the trainer decoded them) and reads ``rewards`` (plus ``scores`` and ``extra_logs`` in
recent versions). slime's ``remote_rm`` posts the sample's ``{"prompt", "response", "label"}`` and
keeps the JSON it gets back as the sample's reward; ``--reward-key reward`` picks the number.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ._base import WireModel

RewardServerMode = Literal["consensus", "agreement", "judge", "ground_truth"]
Label = str | int | float | None


class OpenRLHFRewardRequest(WireModel):
    """``POST /get_reward``: one entry per response; ``prompts[i]`` is the prompt ``query[i]`` starts with."""

    query: list[str] = Field(min_length=1, description="Prompt + response, as the trainer decoded them.")
    prompts: list[str] = Field(description="The prompt of each query (the response is what follows it).")
    labels: list[Label] | None = Field(default=None, description="Dataset labels: read in ground_truth mode only.")

    @model_validator(mode="after")
    def _same_lengths(self) -> OpenRLHFRewardRequest:
        if len(self.prompts) != len(self.query):
            raise ValueError(f"prompts has {len(self.prompts)} entries for {len(self.query)} queries")
        if self.labels is not None and len(self.labels) != len(self.query):
            raise ValueError(f"labels has {len(self.labels)} entries for {len(self.query)} queries")
        return self


class OpenRLHFRewardResponse(WireModel):
    rewards: list[float] = Field(description="One reward per query, in request order.")
    scores: list[float] = Field(description="One score in [0, 1] per query (OpenRLHF's dynamic filtering).")
    extra_logs: dict[str, list[float]] = Field(description="Per-query diagnostics, logged as means by the trainer.")
    weight_versions: dict[str, int] = Field(description="Member -> newest weight version whose samples voted.")


class ChatMessage(WireModel):
    role: str
    content: str


class SlimeRewardRequest(WireModel):
    """``POST /v1/reward``: slime's sample; ``prompt`` is text or chat messages (the last user
    message is the task text)."""

    prompt: str | list[ChatMessage]
    response: str
    label: Label = Field(default=None, description="Dataset label: read in ground_truth mode only.")

    @model_validator(mode="after")
    def _has_user_message(self) -> SlimeRewardRequest:
        if isinstance(self.prompt, list) and not any(m.role == "user" for m in self.prompt):
            raise ValueError("prompt messages hold no user message")
        return self

    def task_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        return [m.content for m in self.prompt if m.role == "user"][-1]


class SlimeRewardResponse(WireModel):
    reward: float = Field(description="The reward (slime: --reward-key reward).")
    score: float = Field(ge=0.0, le=1.0, description="Share of member samples that agree with the response.")
    answer: str | None = Field(description="The response's canonical answer (None: unparseable).")
    consensus: str | None = Field(description="The cohort's consensus answer (None: no consensus or not sampled).")
    weight_versions: dict[str, int] = Field(description="Member -> weight version whose samples voted.")
