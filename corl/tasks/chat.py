"""Free-form chat: the conversations an agent team's own traffic holds (harvested by the gateway, or
imported from logs), answered by every member and rewarded by its peers.

Each prompt is a conversation (``corl.proto.Conversation``: system text, earlier turns, the last user
turn) carried as its JSON; every member renders it its own way (``PromptFormat(conversation=True)``).
Most answers are not one number or one program, so the reward is ``peer_judge``: peers (and outside
endpoints) read the task's judge text, which asks whether a response meets the *rubric* (the cohort
config's ``task.rubric``; ``DEFAULT_RUBRIC`` otherwise), and answer ``Y`` or ``N`` (one token in every
tokenizer corl builds or loads). A short answer (one line of at most ``MAX_ANSWER_CHARS``) is still an
answer that votes, so short-answer conversations can use the vote modes too; a response that only
restates the last user turn (or the system text), or that leaves arithmetic to do, is no answer.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from corl.proto import PromptFormat
from corl.proto.conversation import Conversation, Turn

from .base import Example, OneByOne, Splits, record_fields

DEFAULT_RUBRIC = (
    "The response answers the user's last message correctly and helpfully, follows the system "
    "instructions, and makes nothing up."
)
MAX_ANSWER_CHARS = 40  # a one-line answer at most this long votes; anything longer is judged only
_SPACES = re.compile(r"\s+")
_ARITHMETIC = re.compile(r"\d\s*(?:[-+*/×÷^]|\*\*)\s*\(?\s*-?\d")
_QUOTES = "\"'`“”‘’"
_TRAILING = " .!;:"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def conversation_of(prompt: str) -> Conversation:
    """The conversation a chat prompt carries; a plain text is one user turn."""
    try:
        return Conversation.decode(prompt)
    except ValueError:
        return Conversation(messages=[Turn(role="user", content=prompt)])


def canonical(text: str) -> str:
    """One spelling per short answer: NFKC, case-folded, spaces collapsed, quotes and a final stop dropped."""
    t = _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip().strip(_QUOTES).rstrip(_TRAILING).strip()
    try:
        number = float(t.replace(",", "")) if t and t[-1].isdigit() else None
    except ValueError:
        number = None
    if number is not None and abs(number) < 1e15:
        return str(int(number)) if number.is_integer() else str(number)
    return t.casefold()


@dataclass(frozen=True)
class ChatTask(OneByOne):
    name: str = "chat"
    generates: ClassVar[bool] = False  # prompts come from the gateway's pool or a data file
    runs_code: ClassVar[bool] = False
    max_tokens: int = 256
    rubric: str = DEFAULT_RUBRIC
    correct_token: str = "Y"
    incorrect_token: str = "N"

    def splits(self, seed: int = 0) -> Splits:
        raise NotImplementedError(
            "chat prompts come from the gateway (rounds.prompt_source: {kind: harvest}) or a file "
            "(task.source: conversations.jsonl, e.g. from `corl data import`)"
        )

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat(chat=True, conversation=True)

    @property
    def stop(self) -> tuple[str, ...]:
        return ()

    def extract_answer(self, prompt: str, completion: str) -> str | None:
        text = completion.strip()
        if not text or "\n" in text or len(text) > MAX_ANSWER_CHARS or _ARITHMETIC.search(text):
            return None
        answer = canonical(text)
        conv = conversation_of(prompt)
        restated = {canonical(conv.last_user), canonical(conv.system or "")}
        return None if not answer or answer in restated else answer

    def is_formatted(self, prompt: str, completion: str) -> bool:
        return bool(completion.strip())

    def is_correct(self, example: Example, completion: str) -> bool:
        if example.answer is None:
            return False
        return self.extract_answer(example.prompt, completion) == canonical(example.answer)

    def example(self, record: Mapping[str, Any]) -> Example:
        """A ``{"messages": [...]}`` record (what ``corl data import`` writes; an ``answer`` is kept for
        diagnostics), or any record with a prompt field (one user turn)."""
        answer = record.get("answer")
        messages = record.get("messages")
        if isinstance(messages, list):
            turns = [
                Turn(role=_ROLES[m["role"]], content=m["content"])
                for m in messages
                if isinstance(m, Mapping) and m.get("role") in _ROLES and isinstance(m.get("content"), str)
            ]
            if not turns or turns[-1].role != "user":
                raise ValueError("a conversation record must end with a user turn")
            conv = Conversation(messages=turns)
        else:
            prompt, answer = record_fields(record)
            conv = Conversation(messages=[Turn(role="user", content=prompt)])
        return Example(conv.encode(), None if answer is None else canonical(str(answer)))

    def judge_prompt(self, prompt: str, response: str) -> str:
        conv = conversation_of(prompt)
        transcript = "".join(f"{t.role}: {t.content}\n" for t in conv.messages)
        return (
            f"Rubric: {self.rubric}\n\nConversation:\n{transcript}\nResponse: {response}\n\n"
            f"Does the response meet the rubric? Answer {self.correct_token} or {self.incorrect_token}: "
        )

    @property
    def verdict_tokens(self) -> tuple[str, str]:
        return self.correct_token, self.incorrect_token
