"""The task interface: how prompts are presented and how answers are read from completions.

A task is a plug-in with no model and no service state. Reward code only ever sees canonical
answers produced by ``extract_answer``; ``None`` means unparseable and never counts as a vote.
Dataset answers (``Example.answer``) and hidden tests (``Example.meta``) are for evaluation and
diagnostics only: nothing that computes a peer reward reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

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
    generates: bool  # has its own seeded problem generator (``splits``); else problems come from task.source
    runs_code: bool  # reading an answer runs a program (in the sandbox)
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

    def extract_answers(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        """``extract_answer`` of many (prompt, completion) pairs at once (a task that runs programs runs
        them concurrently). Blocking: async callers run it in a worker thread."""
        ...

    def is_formatted(self, prompt: str, completion: str) -> bool:
        """Is ``completion`` in the form the task's prompt asks for (the number alone, a ``#### x`` last
        line, a program defining the function)? Label-free: the ``format`` control reward and the
        ``formatted`` reading."""
        ...

    def is_correct(self, example: Example, completion: str) -> bool:
        """Evaluation only: is ``completion`` a right answer to ``example`` (dataset answer, hidden tests)?"""
        ...

    def is_correct_many(self, pairs: Sequence[tuple[Example, str]]) -> list[bool]:
        """``is_correct`` of many (example, completion) pairs at once. Blocking, like ``extract_answers``."""
        ...

    def example(self, record: Mapping[str, Any]) -> Example:
        """One data set record (a JSON object) as this task's example, its answer canonicalised."""
        ...

    def judge_prompt(self, prompt: str, response: str) -> str:
        """Text the grader reads before emitting a verdict token."""
        ...

    @property
    def verdict_tokens(self) -> tuple[str, str]:
        """(correct, incorrect) verdict strings, each a single token of the member tokenizers."""
        ...


PROMPT_KEYS = ("prompt", "question", "problem", "input")
ANSWER_KEYS = ("answer", "expected", "final_answer", "solution", "target", "output")


def record_fields(record: Mapping[str, Any]) -> tuple[str, str | None]:
    """(prompt, raw answer) of a data set record under the usual field names."""
    prompt = next((record[k] for k in PROMPT_KEYS if isinstance(record.get(k), str) and record[k].strip()), None)
    if prompt is None:
        raise ValueError(f"record has none of the prompt fields {list(PROMPT_KEYS)}: keys {sorted(record)}")
    answer = next((record[k] for k in ANSWER_KEYS if record.get(k) is not None), None)
    return prompt, None if answer is None else str(answer)


class FromData:
    """A task whose problems come only from a data source (``task.source``): it has no generator."""

    name: str
    generates: ClassVar[bool] = False
    suggested_source: ClassVar[str]  # a source to name when no source is given, e.g. packaged:gsm8k

    def splits(self, seed: int = 0) -> Splits:
        raise NotImplementedError(
            f"{self.name} prompts come from a data source (task.source), e.g. {self.suggested_source}"
        )


class Verdicts:
    """``verdict_tokens`` of a task that names its verdict strings in ``correct_token`` and
    ``incorrect_token`` fields (each a single token of the member tokenizers)."""

    correct_token: str
    incorrect_token: str

    @property
    def verdict_tokens(self) -> tuple[str, str]:
        return self.correct_token, self.incorrect_token


class OneByOne:
    """Batch methods for tasks whose answers are cheap to read one at a time."""

    def extract_answer(self, prompt: str, completion: str) -> str | None:
        raise NotImplementedError

    def is_correct(self, example: Example, completion: str) -> bool:
        raise NotImplementedError

    def extract_answers(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        return [self.extract_answer(p, c) for p, c in pairs]

    def is_correct_many(self, pairs: Sequence[tuple[Example, str]]) -> list[bool]:
        return [self.is_correct(e, c) for e, c in pairs]


def extract_all(task: Task, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
    """Canonical answers of many (prompt, completion) pairs (blocking: may run programs)."""
    return list(task.extract_answers(list(pairs)))


def is_correct_many(task: Task, examples: Sequence[Example], completions: Sequence[str]) -> list[bool]:
    """Evaluation: is each completion right for its example (blocking: may run programs)?"""
    return list(task.is_correct_many(list(zip(examples, completions, strict=True))))
