"""The harvesting gateway (``corl serve gateway``): what it reads of the OpenAI requests it forwards,
what it stores in the run's prompt pool, and its harvest counters.

The gateway forwards requests and replies unchanged, so it never validates a request body as its own:
it reads a *view* of it (``ForwardedHead`` on the request path: which member, streamed or not;
``ChatView``/``CompletionView`` off the request path, for harvesting). Views ignore the fields they do
not name (tools, images, a provider's own options), unlike every other request model of the contract.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ._base import WireModel
from .conversation import Conversation


class _View(BaseModel):
    """Part of a body the gateway forwards but does not own: other fields pass through unread."""

    model_config = ConfigDict(extra="ignore")


class ForwardedHead(_View):
    """What routing reads of a chat or text completion request."""

    model: str = Field(min_length=1, description="The member (or an endpoint member's model name) to forward to.")
    stream: bool = Field(default=False, description="The reply is server-sent events, passed on as they arrive.")


class ViewTurn(_View):
    role: str
    content: str | list[dict[str, Any]] | None = Field(
        default=None, description="Text, or content parts (only text parts are harvested)."
    )

    def text(self) -> str | None:
        """The turn's text; None when it has parts other than text (an image, audio: not harvested)."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in self.content):
            return None
        return "".join(p["text"] for p in self.content)


class ChatView(_View):
    """``/v1/chat/completions``: the conversation sent."""

    messages: list[ViewTurn] = Field(min_length=1)


class CompletionView(_View):
    """``/v1/completions``: the prompt sent (one text is harvested as one user turn; a batch or token ids
    are not)."""

    prompt: str | list[Any]


HarvestRoute = Literal["chat", "completions"]


class HarvestedPrompt(WireModel):
    """One conversation in the run's prompt pool, already redacted."""

    id: str = Field(description="First 16 hex digits of the sha256 of the redacted conversation's JSON.")
    conversation: Conversation
    member: str = Field(description="The member the request was forwarded to.")
    route: HarvestRoute
    at: float = Field(description="Unix time it was harvested.")
    redactions: int = Field(ge=0, description="Spans the redaction patterns replaced, and hook changes (1 each).")


DropReason = Literal["queue_full", "pool_down", "too_large", "unreadable", "duplicate", "redaction_failed"]


class HarvestStats(WireModel):
    """Run-wide harvest counters (Redis), as ``GET /v1/harvest/stats`` and the aggregator's stats report them."""

    harvested: int = Field(ge=0, description="Conversations stored in the pool.")
    redacted: int = Field(ge=0, description="Stored conversations in which redaction replaced something.")
    dropped: dict[DropReason, int] = Field(
        default_factory=dict,
        description="Conversations opted in and sampled but not stored, by reason; the requests themselves "
        "were served.",
    )
    trained_on: int = Field(ge=0, description="Harvested conversations in committed rounds.")
    pool: int = Field(ge=0, description="Conversations in the pool now.")
