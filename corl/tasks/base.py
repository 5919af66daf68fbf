"""The task interface: how prompts are presented and how answers are read from completions.

A task is a plug-in with no model and no service state. Reward code only ever sees canonical
answers produced by ``extract_answer``; ``None`` means unparseable and never counts as a vote.
Dataset answers (``Example.answer``) and hidden tests (``Example.meta``) are for evaluation and
diagnostics only: nothing that computes a peer reward reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from corl.proto import PromptFormat


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str | None = None  # ground truth where the data set has it; never used for peer rewards
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)  # e.g. hidden tests (evaluation only)


@dataclass(frozen=True)
class Splits:
    warmup: list[Example]  # labelled, for supervised warm-up only
    rl: list[Example]  # prompts for RL; their answers are kept for diagnostics only
    eval: list[Example]  # held-out evaluation


class Task(Protocol):
    name: str
    max_tokens: int  # default new tokens per sample (the cohort config's rounds.max_tokens overrides)

    def splits(self, seed: int) -> Splits:
        """The task's own disjoint seeded splits (generated tasks); data-backed tasks raise."""
        ...

    @property
    def prompt_format(self) -> PromptFormat:
        """How every member presents this task's prompts (chat or plain template, system text)."""
        ...

    @property
    def stop(self) -> tuple[str, ...]:
        """Stop strings the task's completions end at (besides each member's own end token)."""
        ...

    def extract_answer(self, prompt: str, completion: str) -> str | None:
        """Canonical answer of ``completion`` to ``prompt`` (the task text, not the rendered one), or
        None when it has no valid answer. Equal answers vote together."""
        ...

    def is_correct(self, example: Example, completion: str) -> bool:
        """Evaluation only: is ``completion`` a right answer to ``example`` (dataset answer, hidden tests)?"""
        ...

    def judge_prompt(self, prompt: str, response: str) -> str:
        """Text the grader reads before emitting a verdict token."""
        ...

    @property
    def verdict_tokens(self) -> tuple[str, str]:
        """(correct, incorrect) verdict strings, each a single token of the member tokenizers."""
        ...


def extract_all(task: Task, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
    """Canonical answers of many (prompt, completion) pairs: the task's batched ``extract_answers``
    where it has one (a task that runs programs runs them concurrently), else one by one."""
    batched = getattr(task, "extract_answers", None)
    if callable(batched):
        return list(batched(list(pairs)))
    return [task.extract_answer(p, c) for p, c in pairs]
