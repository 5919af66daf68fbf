"""Held-out evaluation of a member: greedy, sampled and majority@k accuracy plus answer diversity.

Model work goes through ``corl.models.sampling.sample``; the arithmetic lives in
``corl.cohort.metrics``. The warm-up's band check and ``corl eval`` read answers through one
``MemberReader``, so a member's greedy accuracy in the manifest is the one ``corl eval`` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from corl.models.sampling import sample
from corl.tasks import Example, Task

from . import metrics


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


@dataclass(frozen=True)
class MemberReader:
    """A loaded member answering a task's prompts: its model and tokenizer, tokens per answer, stop
    strings, and how a task prompt becomes its input text (``render``: its chat template, a BOS prefix)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    task: Task
    max_tokens: int = 4
    stop: Sequence[str] = ()
    render: Callable[[str], str] | None = None

    def answers(
        self, prompts: Sequence[str], *, n: int = 1, temperature: float = 0.0, seed: int | None = None, batch: int = 64
    ) -> list[list[str | None]]:
        """``n`` canonical answers to each prompt (``batch`` prompts per sampling call; the ``i``-th call
        seeded ``seed + i``; temperature 0 is greedy)."""
        answers: list[list[str | None]] = []
        for i, chunk in enumerate(_chunks(prompts, batch)):
            out = sample(
                self.model,
                self.tokenizer,
                self.inputs(chunk),
                n=n,
                max_tokens=self.max_tokens,
                temperature=temperature,
                stop=self.stop,
                seed=None if seed is None else seed + i,
            )
            for prompt, completions in zip(chunk, out, strict=True):
                answers.append([self.task.extract_answer(prompt, c.text) for c in completions.completions])
        return answers

    def inputs(self, prompts: Sequence[str]) -> list[str]:
        """The member's input text for each task prompt."""
        return [self.render(p) for p in prompts] if self.render else list(prompts)


def greedy_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    prompts: Sequence[str],
    *,
    max_tokens: int = 4,
    batch_size: int = 256,
    render: Callable[[str], str] | None = None,
    stop: Sequence[str] = (),
) -> list[str | None]:
    """Canonical greedy answer to each prompt (``render``: the member's input text for a task prompt)."""
    reader = MemberReader(model, tokenizer, task, max_tokens, stop, render)
    return [greedy for (greedy,) in reader.answers(prompts, batch=batch_size)]


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    examples: Sequence[Example],
    *,
    max_tokens: int = 4,
) -> float:
    answers = greedy_answers(model, tokenizer, task, [e.prompt for e in examples], max_tokens=max_tokens)
    return metrics.accuracy(answers, [e.answer for e in examples])


def evaluate_model(
    reader: MemberReader, examples: Sequence[Example], *, n_samples: int = 8, temperature: float = 1.0, seed: int = 0
) -> dict[str, float]:
    """Metrics of a loaded member on labelled examples: its greedy answers (256 prompts per call) and
    ``n_samples`` sampled answers to each at ``temperature`` (64 prompts per call)."""
    prompts = [e.prompt for e in examples]
    truth = [e.answer for e in examples]
    greedy = [answer for (answer,) in reader.answers(prompts, batch=256)]
    sampled = reader.answers(prompts, n=n_samples, temperature=temperature, seed=seed)
    flat = [a for group in sampled for a in group]
    return {
        "n_prompts": float(len(examples)),
        "greedy_acc": metrics.accuracy(greedy, truth),
        "sample_acc": metrics.accuracy(flat, [t for t in truth for _ in range(n_samples)]),
        f"maj@{n_samples}_acc": metrics.accuracy([metrics.majority_vote(g) for g in sampled], truth),
        "distinct": metrics.mean([metrics.distinct_count(g) for g in sampled]),
        "entropy": metrics.mean([metrics.answer_entropy(g) for g in sampled]),
        "valid_rate": metrics.mean([a is not None for a in flat]),
    }


def evaluate_member(
    model_dir: str | Path,
    task: Task,
    n_prompts: int | None = None,
    seed: int = 0,
    *,
    split_seed: int = 0,
    n_samples: int = 8,
    max_tokens: int | None = None,
    device: str = "cpu",
) -> dict[str, float]:
    """Load a member (directory or hub id) and evaluate it on the first ``n_prompts`` prompts of the
    task's held-out split (all of them when ``None``), each rendered as a model server renders it (the
    member's chat template where the task asks for one and it has one); ``seed`` drives sampling.
    ``max_tokens`` defaults to the task's."""
    from corl.services.model.rendering import PromptRenderer

    from .loading import load_member

    examples = task.splits(split_seed).eval
    if n_prompts is not None:
        examples = examples[:n_prompts]
    model, tokenizer = load_member(model_dir, device=device)
    renderer, fmt = PromptRenderer(tokenizer), task.prompt_format
    reader = MemberReader(
        model, tokenizer, task, max_tokens or task.max_tokens, task.stop, render=lambda p: renderer.render(p, fmt)
    )
    return evaluate_model(reader, examples, n_samples=n_samples, seed=seed)
