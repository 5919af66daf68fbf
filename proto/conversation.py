"""A conversation as one round prompt: the turns an agent sent (system text, earlier turns, the last
user turn), carried through every prompt-shaped field (``Example.prompt``, ``GenerateRequest.prompts``,
a graded batch) as its compact JSON, so nothing between the prompt pool and the members changes shape.

A ``PromptFormat`` with ``conversation: true`` reads each prompt this way: a member with a chat
template renders the turns with it; one without gets the plain transcript (``"<role>: <content>\\n"``
per turn, then ``"assistant:"``), the same text the OpenAI route renders for it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError

from ._base import WireModel

ConversationRole = Literal["system", "user", "assistant"]


class NotAConversation(ValueError):
    """A prompt read as a conversation (``PromptFormat.conversation``) that carries none."""


class Turn(WireModel):
    role: ConversationRole = Field(description="system (the agent's instructions), user or assistant.")
    content: str = Field(description="The turn's text.")


class Conversation(WireModel):
    """The turns of one harvested or imported chat request, ending with a user turn (what a member answers)."""

    messages: list[Turn] = Field(min_length=1, description="system text, earlier turns, the last user turn.")

    def encode(self) -> str:
        """The prompt string that carries this conversation (compact JSON: one spelling per conversation)."""
        return self.model_dump_json()

    @classmethod
    def decode(cls, prompt: str) -> Conversation:
        """The conversation a prompt string carries; ``NotAConversation`` when it carries none."""
        try:
            return cls.model_validate_json(prompt)
        except ValidationError as err:
            raise NotAConversation(f"the prompt is not a conversation ({err.error_count()} problem(s))") from None

    def turns(self) -> list[dict[str, str]]:
        """As chat-template messages (``role``/``content`` dicts)."""
        return [{"role": t.role, "content": t.content} for t in self.messages]

    def transcript(self) -> str:
        """The plain rendering: a line per turn, then where the assistant's turn begins."""
        return "".join(f"{t.role}: {t.content}\n" for t in self.messages) + "assistant:"

    @property
    def system(self) -> str | None:
        texts = [t.content for t in self.messages if t.role == "system"]
        return "\n".join(texts) if texts else None

    @property
    def last_user(self) -> str:
        """The text of the last user turn (what a response answers; an echo restates it)."""
        return next((t.content for t in reversed(self.messages) if t.role == "user"), "")
