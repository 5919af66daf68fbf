"""Evaluation metrics over canonical answers: pure functions, no model, no I/O.

An answer is the task's canonical string, or ``None`` when the completion had no valid answer.
``None`` is never a vote, never a distinct answer and never correct.
"""

from __future__ import annotations

from collections.abc import Sequence

from corl.rewards import answer_stats, plurality

# Voting and diversity are the same arithmetic the aggregator uses for rewards and diagnostics.
majority_vote = plurality


def distinct_count(answers: Sequence[str | None]) -> int:
    """Number of different valid answers."""
    return answer_stats(answers)[0]


def answer_entropy(answers: Sequence[str | None]) -> float:
    """Shannon entropy (nats) of the empirical distribution of valid answers; 0.0 when there are none."""
    return answer_stats(answers)[1]


def accuracy(predicted: Sequence[str | None], truth: Sequence[str | None]) -> float:
    """Fraction of positions where the prediction is valid and equals the truth."""
    if len(predicted) != len(truth):
        raise ValueError(f"{len(predicted)} predictions for {len(truth)} references")
    if not predicted:
        return 0.0
    return sum(p is not None and p == t for p, t in zip(predicted, truth, strict=True)) / len(predicted)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """Cohen's kappa of two members' correctness on the same problems: 1 when they are right and
    wrong on the same ones, 0 when their agreement is what their accuracies alone would give.
    ``None`` when chance agreement is total (a member always right or always wrong, on every item)."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} readings against {len(b)}")
    if not a:
        return None
    n = len(a)
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pa, pb = sum(a) / n, sum(b) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    return None if chance == 1.0 else (observed - chance) / (1 - chance)
