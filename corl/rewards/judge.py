"""Judge-style rewards: combine several graders' scores of one response, robustly.

Weights are reliabilities (see ``GraderReliability``); a grader missing from ``weights`` or with
weight 0 has no say (fail closed: an unknown grader must be registered before it counts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, cast

from .inputs import RewardInputs, RewardOutcome, check_shapes

CombineMethod = Literal["mean", "median", "trimmed_mean"]


def _weighted(scores: Mapping[str, float], weights: Mapping[str, float]) -> list[tuple[float, float]]:
    pairs = [(float(s), float(weights.get(g, 0.0))) for g, s in scores.items()]
    return sorted((s, w) for s, w in pairs if w > 0.0)


def weighted_median(pairs: Sequence[tuple[float, float]]) -> float:
    """Median of (score, weight) pairs sorted by score; averages the two middles on an exact split."""
    total = sum(w for _, w in pairs)
    half = total / 2.0
    cum = 0.0
    eps = 1e-12 * max(total, 1.0)
    for i, (s, w) in enumerate(pairs):
        cum += w
        if cum > half + eps:
            return s
        if abs(cum - half) <= eps and i + 1 < len(pairs):
            return (s + pairs[i + 1][0]) / 2.0
    return pairs[-1][0]


def weighted_trimmed_mean(pairs: Sequence[tuple[float, float]], trim: float) -> float:
    """Mean after cutting ``trim`` of the total weight from each tail (fractional at the edges)."""
    total = sum(w for _, w in pairs)
    lo, hi = trim * total, (1.0 - trim) * total
    num = den = 0.0
    start = 0.0
    for s, w in pairs:
        kept = max(0.0, min(start + w, hi) - max(start, lo))
        num += kept * s
        den += kept
        start += w
    return num / den if den > 0 else weighted_median(pairs)


def combine_grades(
    scores: Mapping[str, float],
    weights: Mapping[str, float],
    method: CombineMethod = "mean",
    trim: float = 0.2,
) -> float | None:
    """Reliability-weighted mean, median or trimmed mean of one response's grader scores.

    ``None`` when no grader has a positive weight.
    """
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    pairs = _weighted(scores, weights)
    if not pairs:
        return None
    if method == "mean":
        return sum(s * w for s, w in pairs) / sum(w for _, w in pairs)
    if method == "median":
        return weighted_median(pairs)
    if method == "trimmed_mean":
        return weighted_trimmed_mean(pairs, trim)
    raise ValueError(f"unknown combine method {method!r}; expected mean, median or trimmed_mean")


def judge_rewards(
    grades: Mapping[str, Sequence[Sequence[Mapping[str, float]]]],
    weights: Mapping[str, float],
    method: CombineMethod = "mean",
    trim: float = 0.2,
    missing: float = 0.0,
) -> dict[str, list[list[float]]]:
    """Rewards for ``peer_judge``: author -> [prompt][sample] -> {grader: score} combined per response.

    The author's own grade of its response is dropped whatever its weight: a member is never its
    own judge. A response no weighted grader scored gets ``missing``.
    """
    out: dict[str, list[list[float]]] = {}
    for author, prompts in grades.items():
        rows: list[list[float]] = []
        for samples in prompts:
            row = []
            for by_grader in samples:
                peers = {g: s for g, s in by_grader.items() if g != author}
                value = combine_grades(peers, weights, method, trim)
                row.append(missing if value is None else value)
            rows.append(row)
        out[author] = rows
    return out


def peer_judge_rewards(inp: RewardInputs) -> RewardOutcome:
    """``peer_judge``: each response's reward is its peers' (and external graders') judge scores,
    combined with their learnt reliabilities (``judge_rewards``). A prompt counts as labelled for a
    member when some grader other than the member scored one of its samples."""
    check_shapes(inp.answers, inp.members)
    if inp.grades is None:
        raise ValueError("peer_judge needs the round's grades")
    method = cast(CombineMethod, inp.judge_combine)
    grades = {m: inp.grades[m] for m in inp.members}
    rewards = judge_rewards(grades, inp.reliability or {}, method, inp.judge_trim)
    labels: dict[str, list[str | None]] = {
        a: ["graded" if any(any(g != a for g in s) for s in row) else None for row in grades[a]] for a in inp.members
    }
    return RewardOutcome(rewards=rewards, labels=labels, pseudo_labels=inp.pseudo())
