"""``POST /v1/generate``: n samples per prompt with token ids and sampling log-probs."""

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, WithJsonSchema

from ._base import WireInt, WireModel, WireRequest
from .conversation import Conversation

NonEmptyStr = Annotated[str, Field(min_length=1)]
_SLOT = re.compile(r"\{(system|prompt)\}")
MIN_TEMPERATURE = 1e-3


def _temperature(v: float) -> float:
    if 0.0 < v < MIN_TEMPERATURE:  # logits / 1e-198 overflow: sampling would see inf and nan
        raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}")
    return v


Temperature = Annotated[
    float,
    Field(ge=0.0),
    AfterValidator(_temperature),
    WithJsonSchema(
        {
            "anyOf": [{"type": "number", "const": 0}, {"type": "number", "minimum": MIN_TEMPERATURE}],
            "description": f"0 means greedy; otherwise at least {MIN_TEMPERATURE}.",
        }
    ),
]
StopStrings = Annotated[list[NonEmptyStr], Field(max_length=16, description="Stop strings (at most 16).")]


class PromptFormat(WireRequest):
    """How a model server turns a task prompt into its own model's input text.

    With ``chat`` the prompt becomes a user message (after a ``system`` message when one is given),
    rendered with the member's chat template and its generation prompt. A tokenizer without a chat
    template, or ``chat: false``, renders ``template`` instead. The task chooses the format; each
    member renders it its own way, and token ids always come from the member's own tokenizer.
    """

    chat: bool = Field(default=False, description="Render with the member's chat template when it has one.")
    system: str | None = Field(default=None, description="Instruction text: the system message, or {system}.")
    template: str = Field(
        default="{prompt}",
        pattern=r"\{prompt\}",  # unanchored, as JSON Schema reads it: somewhere in the template
        description="Plain template: {prompt} is the task text, {system} the instruction; must contain {prompt}.",
    )
    conversation: bool = Field(
        default=False,
        description="Each prompt is a conversation's JSON (corl.proto.Conversation: system text, earlier turns, "
        "the last user turn): chat renders its turns (after `system`, when the conversation has none); the "
        "plain template gets its transcript as {prompt}.",
    )

    def messages(self, prompt: str) -> list[dict[str, str]]:
        """The prompt as chat messages: the system text (when given), then the prompt as the user's; a
        conversation's own turns (``ValueError`` when the prompt carries none)."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        if self.conversation:
            conv = Conversation.decode(prompt)
            return (system if conv.system is None else []) + conv.turns()
        return [*system, {"role": "user", "content": prompt}]

    def judging(self) -> "PromptFormat":
        """The format of judge texts: a task's judge text is plain text, never a conversation's JSON."""
        return self.model_copy(update={"conversation": False}) if self.conversation else self

    def plain(self, prompt: str) -> str:
        """The prompt in the plain template ({system} and {prompt} filled in one pass: no text is re-read)."""
        text = Conversation.decode(prompt).transcript() if self.conversation else prompt
        values = {"system": self.system or "", "prompt": text}
        return _SLOT.sub(lambda m: values[m.group(1)], self.template)


class SamplingSettings(WireRequest):
    """The sampling settings of a run: sent with every generate call and carried by every graded
    batch, so the trainer recomputes log-probs under the distribution the samples were drawn from."""

    temperature: Temperature = 1.0
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: WireInt = Field(default=16, ge=1, description="Maximum new tokens per sample.")
    stop: StopStrings = Field(default_factory=list)


class GenerateRequest(WireRequest):
    """Sampling request. Server-side bounds (max prompts, n, max_tokens) are configured per server."""

    prompts: list[NonEmptyStr] = Field(min_length=1, description="Prompts (task text), each non-empty.")
    n: WireInt = Field(default=1, ge=1, description="Samples per prompt.")
    max_tokens: WireInt = Field(default=16, ge=1, description="Maximum new tokens per sample.")
    temperature: Temperature = 1.0
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: StopStrings = Field(
        default_factory=list, description="Generation ends after the token that completes one of these."
    )
    seed: WireInt | None = Field(
        default=None, ge=-(2**63), le=2**63 - 1, description="Makes sampling reproducible for this request."
    )
    format: PromptFormat = Field(default_factory=PromptFormat, description="How the server renders each prompt.")

    @classmethod
    def of(cls, prompts: list[str], sampling: SamplingSettings, **kw: object) -> "GenerateRequest":
        return cls(prompts=prompts, **sampling.model_dump(), **kw)  # type: ignore[arg-type]

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(
            temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens, stop=self.stop
        )


FinishReason = Literal["stop", "length"]


class Sample(WireModel):
    text: str = Field(description="Decoded completion, without the end-of-sequence token or stop string.")
    token_ids: list[int] = Field(
        description="Sampled token ids, including the end token (or the tokens of the stop string) when "
        "finish_reason is 'stop'."
    )
    logprobs: list[float] = Field(
        description="Log-probability of each sampled token under the sampling distribution "
        "(after temperature and top-p), one per token id."
    )
    finish_reason: FinishReason


class PromptResult(WireModel):
    prompt: str = Field(description="The prompt as given in the request (task text).")
    prompt_token_ids: list[int] = Field(description="The prompt as the server rendered and tokenised it.")
    samples: list[Sample]


class Usage(WireModel):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class GenerateResponse(WireModel):
    model: str = Field(description="Name of the cohort member that served the request.")
    weight_version: int = Field(ge=0, description="Weights that produced every sample in this response.")
    results: list[PromptResult] = Field(description="One entry per prompt, in request order.")
    usage: Usage | None = Field(
        default=None,
        description="Token counts as reported by a member whose samples carry no token ids (an outside "
        "OpenAI-compatible endpoint, whose weight_version is always 0); None: count the token ids.",
    )
