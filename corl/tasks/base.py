"""The task interface: how prompts are made and how answers are read from completions.

A task is pure: no model, no I/O. Reward code only ever sees canonical answers produced by
``extract_answer``; ``None`` means unparseable and never counts as a vote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str | None = None  # ground truth where the data set has it; never used for peer rewards


@dataclass(frozen=True)
class Splits:
    warmup: list[Example]  # labelled, for supervised warm-up only
    rl: list[Example]  # prompts for RL; their answers are kept for diagnostics only
    eval: list[Example]  # held-out evaluation


class Task(Protocol):
    name: str

    def splits(self, seed: int) -> Splits:
        """Disjoint seeded splits."""
        ...

    def extract_answer(self, completion: str) -> str | None:
        """Canonical answer of a completion, or None when it has no valid answer."""
        ...

    def judge_prompt(self, prompt: str, response: str) -> str:
        """Text the grader reads before emitting a verdict token."""
        ...

    @property
    def verdict_tokens(self) -> tuple[str, str]:
        """(correct, incorrect) verdict strings, each a single token of the member tokenizers."""
        ...
