"""Evaluation metrics over canonical answers: pure functions, no model, no I/O.

An answer is the task's canonical string, or ``None`` when the completion had no valid answer.
``None`` is never a vote, never a distinct answer and never correct.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """The plurality answer among the valid ones; ``None`` when there is none or the top is tied."""
    counts = Counter(a for a in answers if a is not None).most_common(2)
    if not counts or (len(counts) == 2 and counts[0][1] == counts[1][1]):
        return None
    return counts[0][0]


def distinct_count(answers: Sequence[str | None]) -> int:
    """Number of different valid answers."""
    return len({a for a in answers if a is not None})


def answer_entropy(answers: Sequence[str | None]) -> float:
    """Shannon entropy (nats) of the empirical distribution of valid answers; 0.0 when there are none."""
    counts = Counter(a for a in answers if a is not None)
    total = sum(counts.values())
    if total == 0:
        return 0.0
    return max(0.0, -sum(c / total * math.log(c / total) for c in counts.values()))


def accuracy(predicted: Sequence[str | None], truth: Sequence[str | None]) -> float:
    """Fraction of positions where the prediction is valid and equals the truth."""
    if len(predicted) != len(truth):
        raise ValueError(f"{len(predicted)} predictions for {len(truth)} references")
    if not predicted:
        return 0.0
    return sum(p is not None and p == t for p, t in zip(predicted, truth, strict=True)) / len(predicted)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
