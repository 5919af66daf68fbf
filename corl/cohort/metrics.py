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
