"""Vote-style rewards: peer labels, soft peer agreement and the two baselines.

Every function here is pure. A member's rewards are computed from its peers' canonical answers
only; its own answers decide which of its samples match, never what they are matched against.
Dataset answers are read by the ``ground_truth`` baseline and nowhere else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Answers = Mapping[str, Sequence[Sequence[str | None]]]
"""member -> [prompt][sample] canonical answers; ``None`` marks an unparseable sample."""

RewardMode = Literal["peer_label", "peer_agreement", "self_vote", "ground_truth", "none"]
VOTE_MODES: tuple[str, ...] = ("peer_label", "peer_agreement", "self_vote", "ground_truth", "none")
PEER_MODES: tuple[str, ...] = ("peer_label", "peer_agreement")


@dataclass(frozen=True)
class RewardOutcome:
    """Rewards of one round plus the labels behind them (for diagnostics and graded batches)."""

    rewards: dict[str, list[list[float]]]  # member -> [prompt][sample]
    labels: dict[str, list[str | None]]  # member -> supervision label per prompt (None: no label)
    pseudo_labels: dict[str, list[str | None]]  # member -> plurality of its own samples per prompt


def plurality(votes: Sequence[str | None]) -> str | None:
    """The most frequent valid vote; ``None`` when there is none or the top is tied."""
    counts = Counter(v for v in votes if v is not None)
    if not counts:
        return None
    top = counts.most_common(2)
    if len(top) == 2 and top[0][1] == top[1][1]:
        return None
    return top[0][0]


def pseudo_label(answers: Sequence[str | None], threshold: float = 0.0) -> str | None:
    """A member's own label for one prompt: the plurality of its valid answers.

    ``None`` when no answer is valid, when the top is tied, or when the winner's share of *all*
    G samples (unparseable ones included, so a mostly-broken group cannot be confident) is below
    ``threshold``.
    """
    label = plurality(answers)
    if label is None or not answers:
        return None
    if threshold > 0.0 and sum(1 for a in answers if a == label) / len(answers) < threshold:
        return None
    return label


def _check_shapes(answers: Answers, members: Sequence[str]) -> int:
    missing = [m for m in members if m not in answers]
    if missing:
        raise ValueError(f"members {missing} have no answers; answers hold {list(answers)}")
    sizes = {m: len(a) for m, a in answers.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"every member must answer the same prompts; prompts per member: {sizes}")
    return next(iter(sizes.values()), 0)


def supervisors(
    member: str, present: Sequence[str], topology: Literal["all", "ring"], order: Sequence[str] | None
) -> list[str]:
    """The peers whose votes supervise ``member``: all others, or its ring predecessor.

    In the ring, members absent this round (not in ``present``) are skipped, so the predecessor
    is the nearest present member before ``member`` in ``order``.
    """
    if topology == "all":
        return [m for m in present if m != member]
    if topology != "ring":
        raise ValueError(f"unknown topology {topology!r}; expected 'all' or 'ring'")
    ring = list(order) if order is not None else list(present)
    unknown = [m for m in present if m not in ring]
    if unknown:
        raise ValueError(f"members {unknown} are missing from the ring order {ring}")
    live = [m for m in ring if m in present]
    if len(live) < 2:
        return []
    return [live[live.index(member) - 1]]


def _match(samples: Sequence[str | None], label: str | None) -> list[float]:
    if label is None:
        return [0.0] * len(samples)
    return [1.0 if a is not None and a == label else 0.0 for a in samples]


def _peer_labels(pseudo: Mapping[str, Sequence[str | None]], sups: Sequence[str], n_prompts: int) -> list[str | None]:
    # Plurality over the supervisors' pseudo-labels; with one supervisor this is its label.
    return [plurality([pseudo[s][p] for s in sups]) for p in range(n_prompts)]


def _agreement_rewards(
    answers: Answers, member: str, sups: Sequence[str], reliability: Mapping[str, float] | None
) -> list[list[float]]:
    rewards: list[list[float]] = []
    for p, own in enumerate(answers[member]):
        weighted: dict[str, float] = {}
        total = 0.0
        for s in sups:
            w = 1.0 if reliability is None else float(reliability.get(s, 1.0))
            if w <= 0.0:
                continue
            peer = answers[s][p]
            total += w * len(peer)
            for a in peer:
                if a is not None:
                    weighted[a] = weighted.get(a, 0.0) + w
        rewards.append([weighted.get(a, 0.0) / total if a is not None and total > 0 else 0.0 for a in own])
    return rewards


def compute_rewards(
    mode: str,
    answers: Answers,
    *,
    members: Sequence[str] | None = None,
    threshold: float = 0.0,
    topology: Literal["all", "ring"] = "all",
    order: Sequence[str] | None = None,
    reliability: Mapping[str, float] | None = None,
    dataset_answers: Sequence[str | None] | None = None,
) -> RewardOutcome:
    """Per-sample rewards for ``members`` from one round of answers.

    Every member in ``answers`` votes (frozen members too); only ``members`` (default: all) get
    rewards. Modes:

    - ``peer_label``: 1 if the sample equals the peers' label (plurality of the supervisors'
      pseudo-labels, ties discarded), else 0; no label gives 0 to every sample of the prompt.
    - ``peer_agreement``: reliability-weighted fraction of the supervisors' samples (invalid
      ones included in the denominator) that equal this sample. ``labels`` then holds the
      peer_label labels as a diagnostic; they do not enter the reward.
    - ``self_vote`` (baseline): 1 if the sample equals the member's own pseudo-label.
    - ``ground_truth`` (upper bound): 1 if the sample equals ``dataset_answers[prompt]``.
    - ``none``: all zeros.

    ``reliability`` (member -> weight, default 1.0) only weighs ``peer_agreement`` votes.
    ``dataset_answers`` is read only in ``ground_truth`` mode.
    """
    if mode not in VOTE_MODES:
        hint = "; peer_judge rewards come from judge_rewards()" if mode == "peer_judge" else ""
        raise ValueError(f"unknown vote reward mode {mode!r}; expected one of {VOTE_MODES}{hint}")
    present = list(answers)
    targets = list(members) if members is not None else present
    n_prompts = _check_shapes(answers, targets)
    pseudo = {m: [pseudo_label(s, threshold) for s in answers[m]] for m in present}

    rewards: dict[str, list[list[float]]] = {}
    labels: dict[str, list[str | None]] = {}
    if mode == "ground_truth":
        if dataset_answers is None:
            raise ValueError("ground_truth mode needs dataset_answers (the data set has no answers?)")
        if len(dataset_answers) != n_prompts:
            raise ValueError(f"dataset_answers has {len(dataset_answers)} entries for {n_prompts} prompts")
        truth = list(dataset_answers)
        for m in targets:
            labels[m] = truth
            rewards[m] = [_match(s, t) for s, t in zip(answers[m], truth, strict=True)]
    elif mode == "none":
        for m in targets:
            labels[m] = [None] * n_prompts
            rewards[m] = [[0.0] * len(s) for s in answers[m]]
    elif mode == "self_vote":
        for m in targets:
            labels[m] = list(pseudo[m])
            rewards[m] = [_match(s, lab) for s, lab in zip(answers[m], pseudo[m], strict=True)]
    else:
        for m in targets:
            sups = supervisors(m, present, topology, order)
            labels[m] = _peer_labels(pseudo, sups, n_prompts)
            if mode == "peer_label":
                rewards[m] = [_match(s, lab) for s, lab in zip(answers[m], labels[m], strict=True)]
            else:
                rewards[m] = _agreement_rewards(answers, m, sups, reliability)
    return RewardOutcome(rewards=rewards, labels=labels, pseudo_labels={m: pseudo[m] for m in present})
