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


@dataclass(frozen=True)
class RewardInputs:
    """Everything a reward function may read about one round. ``dataset_answers`` is filled only for
    modes that use labels (``REWARD_MODES[mode].uses_labels``); ``grades`` only for judged modes."""

    answers: Answers  # every member present this round (frozen ones vote too)
    members: Sequence[str]  # who gets rewards
    threshold: float = 0.0
    topology: Literal["all", "ring"] = "all"
    order: Sequence[str] | None = None
    reliability: Mapping[str, float] | None = None
    dataset_answers: Sequence[str | None] | None = None
    grades: Mapping[str, Sequence[Sequence[Mapping[str, float]]]] | None = None
    judge_combine: str = "mean"
    judge_trim: float = 0.2

    @property
    def n_prompts(self) -> int:
        return _check_shapes(self.answers, self.members)

    def pseudo(self) -> dict[str, list[str | None]]:
        return {m: [pseudo_label(s, self.threshold) for s in self.answers[m]] for m in self.answers}


def _outcome(inp: RewardInputs, rewards: dict, labels: dict, pseudo: dict | None = None) -> RewardOutcome:
    return RewardOutcome(rewards=rewards, labels=labels, pseudo_labels=pseudo if pseudo is not None else inp.pseudo())


def peer_label_rewards(inp: RewardInputs) -> RewardOutcome:
    """Co-RL: 1 if the sample equals the peers' label (plurality of the supervisors' pseudo-labels,
    ties discarded), else 0; a prompt without a label gives 0 to all its samples."""
    n, pseudo = inp.n_prompts, inp.pseudo()
    labels = {
        m: _peer_labels(pseudo, supervisors(m, list(inp.answers), inp.topology, inp.order), n) for m in inp.members
    }
    rewards = {m: [_match(s, lab) for s, lab in zip(inp.answers[m], labels[m], strict=True)] for m in inp.members}
    return _outcome(inp, rewards, labels, pseudo)


def peer_agreement_rewards(inp: RewardInputs) -> RewardOutcome:
    """Reliability-weighted fraction of the supervisors' samples (invalid ones count in the
    denominator) that equal this sample. ``labels`` holds the peer_label labels as a diagnostic."""
    n, pseudo, present = inp.n_prompts, inp.pseudo(), list(inp.answers)
    labels, rewards = {}, {}
    for m in inp.members:
        sups = supervisors(m, present, inp.topology, inp.order)
        labels[m] = _peer_labels(pseudo, sups, n)
        rewards[m] = _agreement_rewards(inp.answers, m, sups, inp.reliability)
    return _outcome(inp, rewards, labels, pseudo)


def pooled_labels(answers: Answers, sups: Sequence[str], n_prompts: int, threshold: float = 0.0) -> list[str | None]:
    """Per prompt, the plurality of the supervisors' samples pooled together (every peer sample is
    one vote, so a peer's confidence counts, unlike ``peer_label``'s one label per peer). ``None``
    on a tie, with no valid vote, or (abstention) when the winner's share of all pooled samples,
    unparseable ones included, is below ``threshold``."""
    return [pseudo_label([a for s in sups for a in answers[s][p]], threshold) for p in range(n_prompts)]


def peer_pool_rewards(inp: RewardInputs) -> RewardOutcome:
    """1 if the sample equals the plurality of the supervisors' pooled samples, else 0; a prompt
    whose pooled vote is tied or below ``threshold`` gives 0 to all its samples."""
    n, present = inp.n_prompts, list(inp.answers)
    labels = {
        m: pooled_labels(inp.answers, supervisors(m, present, inp.topology, inp.order), n, inp.threshold)
        for m in inp.members
    }
    rewards = {m: [_match(s, lab) for s, lab in zip(inp.answers[m], labels[m], strict=True)] for m in inp.members}
    return _outcome(inp, rewards, labels)


def self_vote_rewards(inp: RewardInputs) -> RewardOutcome:
    """Baseline (TTRL-style, collapses): 1 if the sample equals the member's own pseudo-label."""
    _check_shapes(inp.answers, inp.members)
    pseudo = inp.pseudo()
    labels = {m: list(pseudo[m]) for m in inp.members}
    rewards = {m: [_match(s, lab) for s, lab in zip(inp.answers[m], pseudo[m], strict=True)] for m in inp.members}
    return _outcome(inp, rewards, labels, pseudo)


def ground_truth_rewards(inp: RewardInputs) -> RewardOutcome:
    """Upper bound for experiments only: 1 if the sample equals the data set's answer."""
    n = inp.n_prompts
    if inp.dataset_answers is None:
        raise ValueError("ground_truth mode needs dataset_answers (the data set has no answers?)")
    if len(inp.dataset_answers) != n:
        raise ValueError(f"dataset_answers has {len(inp.dataset_answers)} entries for {n} prompts")
    truth = list(inp.dataset_answers)
    labels = dict.fromkeys(inp.members, truth)
    rewards = {m: [_match(s, t) for s, t in zip(inp.answers[m], truth, strict=True)] for m in inp.members}
    return _outcome(inp, rewards, labels)


def no_rewards(inp: RewardInputs) -> RewardOutcome:
    """Control: every reward is 0 (no training signal)."""
    n = inp.n_prompts
    labels: dict[str, list[str | None]] = {m: [None] * n for m in inp.members}
    return _outcome(inp, {m: [[0.0] * len(s) for s in inp.answers[m]] for m in inp.members}, labels)


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
    """Per-sample rewards for ``members`` (default: every member in ``answers``) from one round of
    answers, by a vote mode of ``corl.rewards.modes.REWARD_MODES``. Every member in ``answers``
    votes (frozen members too). ``reliability`` (member -> weight, default 1.0) weighs
    ``peer_agreement`` votes. ``dataset_answers`` reaches only modes that use labels."""
    from .modes import REWARD_MODES

    spec = REWARD_MODES.get(mode)  # type: ignore[call-overload]
    if spec is None or spec.judged:
        hint = "; peer_judge rewards come from judge_rewards()" if mode == "peer_judge" else ""
        vote = [m for m, s in REWARD_MODES.items() if not s.judged]
        raise ValueError(f"unknown vote reward mode {mode!r}; expected one of {vote}{hint}")
    inp = RewardInputs(
        answers=answers,
        members=list(members) if members is not None else list(answers),
        threshold=threshold,
        topology=topology,
        order=order,
        reliability=reliability,
        dataset_answers=dataset_answers if spec.uses_labels else None,
    )
    return spec.fn(inp)
