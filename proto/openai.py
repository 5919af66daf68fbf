"""The OpenAI-compatible routes of a model server: ``POST /v1/chat/completions``,
``POST /v1/completions`` and ``GET /v1/models``, in the shapes OpenAI's clients send and read.

The subset a cohort member can serve: ``n``, ``temperature``, ``top_p``, ``max_tokens``, ``stop``,
``seed``, sampled-token ``logprobs`` and ``stream``. Fields this server does not implement (tools,
``logit_bias``, ...) are unknown fields: 422 naming the field, never silently ignored; penalties are
accepted as 0 (off) only. ``top_logprobs > 0`` (chat) and ``logprobs > 0`` (completions) are 422:
the engine keeps the sampled token's log-prob only. Log-probs are those of the sampling distribution (after
temperature and top-p), as in ``/v1/generate``. ``system_fingerprint`` is ``corl-w<version>``,
the weight version that produced every choice (also in the ``X-Corl-Weight-Version`` header).
"""

from typing import Annotated, Literal

from pydantic import Field

from ._base import WireModel
from .generate import NonEmptyStr, Usage

WEIGHT_VERSION_HEADER = "X-Corl-Weight-Version"
OpenAIStop = Annotated[
    NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=16)] | None,
    Field(description="A stop string or up to 16; the text ends before it (it is not returned)."),
]
OpenAIFinishReason = Literal["stop", "length"]


def fingerprint(weight_version: int) -> str:
    return f"corl-w{weight_version}"


class StreamOptions(WireModel):
    include_usage: bool = Field(default=False, description="Send a last chunk with usage and no choices.")


class _Sampling(WireModel):
    """Fields both completion requests share."""

    model: str = Field(min_length=1, description="The member's name (GET /v1/models).")
    n: int = Field(default=1, ge=1, description="Choices to generate.")
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="0 means greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: OpenAIStop = None
    seed: int | None = Field(default=None, description="Makes sampling reproducible for this request.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, description="Accepted and ignored.")
    # Some clients send the penalties on every call: 0 (off) is accepted, anything else is 422.
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="Only 0 is served.")
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="Only 0 is served.")

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatContentPart(WireModel):
    type: Literal["text"] = Field(description="Only text parts are served.")
    text: str


class ChatMessage(WireModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ChatContentPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``. Messages are rendered with the member's chat template; a member
    without one gets ``"<role>: <content>\\n"`` per message followed by ``"assistant:"``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(
        default=None, ge=1, description="Default: the server's bound (CORL_MAX_TOKENS), less what the context lacks."
    )
    max_completion_tokens: int | None = Field(default=None, ge=1, description="Newer name of max_tokens.")
    logprobs: bool = Field(default=False, description="Return each sampled token's log-prob.")
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description="Only 0 is served (422 otherwise).")

    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: raw prompts, no template."""

    prompt: NonEmptyStr | Annotated[list[NonEmptyStr], Field(min_length=1)] = Field(
        description="A prompt or a list of prompts (text only)."
    )
    max_tokens: int = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=5, description="Only 0 is served (422 otherwise).")
    echo: Literal[False] = Field(default=False, description="Not served: must be false.")

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


# --- responses ---------------------------------------------------------------------------------


class TopLogprob(WireModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(WireModel):
    token: str
    logprob: float = Field(description="Log-prob under the sampling distribution (after temperature, top-p).")
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list, description="Always empty.")


class ChoiceLogprobs(WireModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(WireModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(WireModel):
    index: int = Field(ge=0)
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: OpenAIFinishReason


class _Completed(WireModel):
    id: str
    created: int = Field(description="Unix seconds.")
    model: str
    system_fingerprint: str = Field(description="corl-w<weight version>: the weights behind every choice.")


class ChatCompletion(_Completed):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChoiceDelta(WireModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(WireModel):
    index: int = Field(ge=0)
    delta: ChoiceDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = None


class ChatCompletionChunk(_Completed):
    """One server-sent event of a streamed chat completion (``data: <json>``; the stream ends with
    ``data: [DONE]``)."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(WireModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(WireModel):
    index: int = Field(ge=0)
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = Field(description="null in a stream chunk that does not end it.")


class TextCompletion(_Completed):
    """The ``/v1/completions`` answer, and (``object`` ``text_completion``, as OpenAI streams it)
    each of its stream chunks."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(WireModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "corl"


class ModelList(WireModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
