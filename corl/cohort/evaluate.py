"""Held-out evaluation of a member: greedy, sampled and majority@k accuracy plus answer diversity.

Model work goes through ``corl.models.sampling.sample``; the arithmetic lives in
``corl.cohort.metrics``. The warm-up's band check and ``corl eval`` share ``greedy_answers``, so
a member's greedy accuracy in the manifest is the one ``corl eval`` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from corl.models.sampling import sample
from corl.tasks import Example, Task

from . import metrics


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


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
    answers: list[str | None] = []
    for chunk in _chunks(prompts, batch_size):
        inputs = [render(p) for p in chunk] if render else list(chunk)
        out = sample(model, tokenizer, inputs, n=1, max_tokens=max_tokens, temperature=0.0, stop=stop)
        answers += [task.extract_answer(p, c.completions[0].text) for p, c in zip(chunk, out, strict=True)]
    return answers


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
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    examples: Sequence[Example],
    *,
    n_samples: int = 8,
    temperature: float = 1.0,
    max_tokens: int = 4,
    seed: int = 0,
    batch_size: int = 64,
    render: Callable[[str], str] | None = None,
    stop: Sequence[str] = (),
) -> dict[str, float]:
    """Metrics of a loaded model on labelled examples (prompts per sampling batch: ``batch_size``);
    ``render`` turns a task prompt into the model's input (its chat template, a BOS prefix)."""
    prompts = [e.prompt for e in examples]
    truth = [e.answer for e in examples]
    greedy = greedy_answers(model, tokenizer, task, prompts, max_tokens=max_tokens, render=render, stop=stop)
    sampled: list[list[str | None]] = []
    for i, chunk in enumerate(_chunks(prompts, batch_size)):
        out = sample(
            model,
            tokenizer,
            [render(p) for p in chunk] if render else list(chunk),
            n=n_samples,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            seed=seed + i,
        )
        sampled += [[task.extract_answer(p, c.text) for c in pc.completions] for p, pc in zip(chunk, out, strict=True)]
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
    return evaluate_model(
        model,
        tokenizer,
        task,
        examples,
        n_samples=n_samples,
        max_tokens=max_tokens or task.max_tokens,
        seed=seed,
        render=lambda p: renderer.render(p, fmt),
        stop=task.stop,
    )
