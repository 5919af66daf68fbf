"""Per-round diagnostics: answer diversity, agreement between members, label accuracy, collapse.

Pure functions. ``label_accuracy`` is the one place dataset answers meet labels, and only to be
logged; nothing here feeds back into rewards.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)


def answer_stats(samples: Sequence[str | None]) -> tuple[int, float]:
    """(distinct valid answers, entropy in nats of the valid-answer distribution) of one prompt."""
    counts = Counter(a for a in samples if a is not None)
    n = sum(counts.values())
    if n == 0:
        return 0, 0.0
    entropy = -sum(c / n * math.log(c / n) for c in counts.values())
    return len(counts), max(0.0, entropy)


def diversity(samples_by_prompt: Sequence[Sequence[str | None]]) -> tuple[float, float]:
    """A member's round diversity: (mean distinct valid answers per sample, mean entropy in nats).

    The first number is the *distinct-answer rate* ``distinct / G`` averaged over prompts, the
    collapse guard's ``distinct_rate`` signal (``corl.rewards.guard``).
    """
    rates, entropies = [], []
    for samples in samples_by_prompt:
        if not samples:
            continue
        distinct, entropy = answer_stats(samples)
        rates.append(distinct / len(samples))
        entropies.append(entropy)
    if not rates:
        return 0.0, 0.0
    return sum(rates) / len(rates), sum(entropies) / len(entropies)


def cohort_diversity(pseudo_labels: Mapping[str, Sequence[str | None]]) -> float:
    """Mean over prompts of distinct pseudo-labels across members / members (1.0: all differ)."""
    members = list(pseudo_labels)
    if not members:
        return 0.0
    n_prompts = len(pseudo_labels[members[0]])
    if n_prompts == 0:
        return 0.0
    total = sum(len({pseudo_labels[m][p] for m in members} - {None}) for p in range(n_prompts))
    return total / (n_prompts * len(members))


def labelled_fraction(labels: Sequence[str | None]) -> float:
    """Fraction of prompts that got a supervision label."""
    return sum(1 for lab in labels if lab is not None) / len(labels) if labels else 0.0


def agreement_matrix(pseudo_labels: Mapping[str, Sequence[str | None]]) -> dict[str, dict[str, float]]:
    """Fraction of prompts where both members have a pseudo-label and the labels are equal.

    The diagonal is each member's labelled fraction.
    """
    out: dict[str, dict[str, float]] = {}
    for a, la in pseudo_labels.items():
        row = {}
        for b, lb in pseudo_labels.items():
            hits = sum(1 for x, y in zip(la, lb, strict=True) if x is not None and x == y)
            row[b] = hits / len(la) if la else 0.0
        out[a] = row
    return out


def label_accuracy(labels: Sequence[str | None], dataset_answers: Sequence[str | None]) -> float | None:
    """Accuracy of labels on the prompts that have both a label and a dataset answer (diagnostic only)."""
    pairs = [(lab, t) for lab, t in zip(labels, dataset_answers, strict=True) if lab is not None and t is not None]
    if not pairs:
        return None
    return sum(1 for lab, t in pairs if lab == t) / len(pairs)


def label_share(
    pseudo_labels: Mapping[str, Sequence[str | None]], labels: Mapping[str, Sequence[str | None]]
) -> dict[str, float | None]:
    """Per member: of the supervision labels the *other* members got (prompts with a label), the share
    equal to this member's own pseudo-label: how often its answer was the label. ``None`` when no
    other member got a label. It shows how much a member (a frozen outside agent, say) steers the rest."""
    out: dict[str, float | None] = {}
    for m, mine in pseudo_labels.items():
        hits = total = 0
        for other, theirs in labels.items():
            if other == m:
                continue
            for own, label in zip(mine, theirs, strict=True):
                if label is not None:
                    total += 1
                    hits += own == label
        out[m] = hits / total if total else None
    return out


def reward_accuracy(
    answers: Sequence[Sequence[str | None]], rewards: Sequence[Sequence[float]], dataset_answers: Sequence[str | None]
) -> float | None:
    """TTRL's reward accuracy: the share of samples (on prompts with a dataset answer) whose reward
    says what the data set says: rewarded (>= 0.5) exactly when the answer is right. Diagnostic only."""
    hits = total = 0
    for samples, row, truth in zip(answers, rewards, dataset_answers, strict=True):
        if truth is None:
            continue
        for a, r in zip(samples, row, strict=True):
            hits += (r >= 0.5) == (a is not None and a == truth)
            total += 1
    return hits / total if total else None


def majority_ratio(answers: Sequence[Sequence[str | None]]) -> float:
    """TTRL's majority ratio: the share of a prompt's G samples that give its most common valid
    answer, averaged over prompts (1.0: every sample agrees)."""
    shares = [max(Counter(a for a in s if a is not None).values(), default=0) / len(s) for s in answers if s]
    return sum(shares) / len(shares) if shares else 0.0


def collapse_round(series: Sequence[tuple[int, float]], drop: float = 0.05, patience: int = 3) -> int | None:
    """The round where a sustained fall starts: the first round after which the value stays more
    than ``drop`` below its running peak for the rest of the run (at least ``patience`` points).
    ``series`` is (round, value) in round order; None when it never falls for good."""
    peak, start = float("-inf"), None
    points = [(r, v) for r, v in series if v is not None]
    for i, (_, v) in enumerate(points):
        if v > peak:
            peak = v
        fallen = v < peak - drop
        if fallen and start is None:
            start = i
        elif not fallen:
            start = None
    if start is None or len(points) - start < patience:
        return None
    return points[start][0]
