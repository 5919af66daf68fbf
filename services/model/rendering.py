"""Rendering a task prompt for one member: its own chat template, or the task's plain template.

Each member renders with its own tokenizer (no text is re-tokenised across members). A tokenizer
that adds a BOS token by default (Gemma) gets it as text in front of plain renderings, because
the servers tokenise rendered text without adding special tokens; chat templates write their own.

A chat (``render_messages``, the OpenAI route) uses the chat template too; a member without one
gets a plain role-prefixed transcript: ``"<role>: <content>\n"`` per message, then ``"assistant:"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corl.proto import PromptFormat

_RAW = PromptFormat()


class PromptRenderer:
    """``tokenizer`` None (an engine that takes text as it is) renders plain templates only."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        bos_id = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
        ids = tokenizer("a")["input_ids"] if bos_id is not None else []
        self._bos = tokenizer.bos_token if ids and ids[0] == bos_id else ""

    def describe(self) -> str:
        """How this member presents chat-format task prompts (logged when a server starts)."""
        bos = f" after the BOS token {self._bos!r}" if self._bos else ""
        if self.has_chat_template:
            return f"chat-format prompts use the tokenizer's chat template; plain ones the task template{bos}"
        return f"no chat template: every prompt uses the task's plain template{bos}"

    def render(self, prompt: str, fmt: PromptFormat = _RAW) -> str:
        if fmt.chat and self.has_chat_template:
            text = self._tokenizer.apply_chat_template(fmt.messages(prompt), tokenize=False, add_generation_prompt=True)
            return str(text)
        if fmt == _RAW:
            return self._bos + prompt
        return self._bos + fmt.plain(prompt)

    def render_all(self, prompts: Sequence[str], fmt: PromptFormat = _RAW) -> list[str]:
        if fmt == _RAW and not self._bos:
            return list(prompts)  # the tiny cohort's path: nothing to render
        return [self.render(p, fmt) for p in prompts]

    def render_messages(self, messages: Sequence[Mapping[str, str]]) -> str:
        """A chat (``role``/``content`` dicts) as the member's input text, ending where the assistant's
        turn begins. Raises ``ValueError`` when the chat template refuses the messages."""
        if self.has_chat_template:
            # Many templates know no "developer" role: it is OpenAI's newer name for "system".
            chat = [{**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in messages]
            try:
                text = self._tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            except Exception as err:  # noqa: BLE001 - jinja raises whatever the template author chose
                raise ValueError(f"the chat template refused the messages: {err}") from None
            return str(text)
        return self._bos + "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
