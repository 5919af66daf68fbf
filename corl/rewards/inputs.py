"""What every reward function reads and returns, and the votes they share: the one module that
``votes``, ``judge`` and the mode table (``modes``) all import, and that imports none of them."""

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
    pseudo_labels: dict[str, list[str | None]]  # member -> plurality of its own votes per prompt
    weights: dict[str, list[float]] | None = None  # member -> advantage weight per prompt (None: all 1)


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
    if threshold > 0.0 and share(answers, label) < threshold:
        return None
    return label


def share(samples: Sequence[str | None], answer: str | None) -> float:
    """``answer``'s share of ``samples``, unparseable ones included (0 for no answer or no samples)."""
    return sum(1 for a in samples if a == answer) / len(samples) if answer is not None and samples else 0.0


def supervisors(
    member: str,
    present: Sequence[str],
    topology: Literal["all", "ring"],
    order: Sequence[str] | None,
    teachers: Mapping[str, str] | None = None,
) -> list[str]:
    """The members whose votes supervise ``member``: all other peers, or its ring predecessor, plus
    its own teachers (``teachers``: teacher -> student) when they are present.

    Teachers supervise only their student and never alone: without a peer there is no supervision.
    In the ring, members absent this round (not in ``present``) are skipped, so the predecessor is
    the nearest present peer before ``member`` in ``order``.
    """
    teachers = teachers or {}
    mine = [t for t in present if teachers.get(t) == member]
    peers = [m for m in present if m not in teachers]
    if topology == "all":
        sups = [m for m in peers if m != member]
    elif topology == "ring":
        ring = [m for m in (order if order is not None else present) if m not in teachers]
        unknown = [m for m in peers if m not in ring]
        if unknown:
            raise ValueError(f"members {unknown} are missing from the ring order {ring}")
        live = [m for m in ring if m in peers]
        sups = [live[live.index(member) - 1]] if len(live) >= 2 and member in live else []
    else:
        raise ValueError(f"unknown topology {topology!r}; expected 'all' or 'ring'")
    return sups + mine if sups else []


def check_shapes(answers: Answers, members: Sequence[str]) -> int:
    missing = [m for m in members if m not in answers]
    if missing:
        raise ValueError(f"members {missing} have no answers; answers hold {list(answers)}")
    sizes = {m: len(a) for m, a in answers.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"every member must answer the same prompts; prompts per member: {sizes}")
    return next(iter(sizes.values()), 0)


@dataclass(frozen=True)
class RewardInputs:
    """Everything a reward function may read about one round. ``dataset_answers`` is filled only for
    modes that use labels (``REWARD_MODES[mode].uses_labels``); ``grades`` only for judged modes."""

    answers: Answers  # every member present this round (frozen ones vote too): the samples rewarded
    members: Sequence[str]  # who gets rewards
    votes: Answers | None = None  # samples drawn only to vote (``reward.votes``); None: ``answers`` vote
    threshold: float = 0.0
    surer_peers: bool = False  # peer_pool: a label only where the peers are surer than the member
    topology: Literal["all", "ring"] = "all"
    order: Sequence[str] | None = None
    teachers: Mapping[str, str] | None = None  # teacher -> the one member it votes for (beside its peers)
    reliability: Mapping[str, float] | None = None
    dataset_answers: Sequence[str | None] | None = None
    grades: Mapping[str, Sequence[Sequence[Mapping[str, float]]]] | None = None
    judge_combine: str = "mean"
    judge_trim: float = 0.2
    formatted: Mapping[str, Sequence[Sequence[bool]]] | None = None  # [prompt][sample]: in the asked form
    seed: int = 0  # the round's seed (the random control's draws)
    p: float = 0.5  # the random control's chance of a reward

    @property
    def n_prompts(self) -> int:
        n = check_shapes(self.answers, self.members)
        if self.votes is not None:
            if set(self.votes) != set(self.answers):
                raise ValueError(f"votes hold {sorted(self.votes)}, answers {sorted(self.answers)}")
            if check_shapes(self.votes, self.members) != n:
                raise ValueError("votes and answers must cover the same prompts")
        return n

    def supervisors(self, member: str) -> list[str]:
        """Whose ballots supervise ``member`` this round (see ``supervisors``)."""
        return supervisors(member, list(self.answers), self.topology, self.order, self.teachers)

    @property
    def ballots(self) -> Answers:
        """What each member votes with: its vote samples when the round drew them, else its answers."""
        return self.answers if self.votes is None else self.votes

    def pseudo(self) -> dict[str, list[str | None]]:
        """Each member's own label per prompt: the plurality of its ballots."""
        return {m: [pseudo_label(s, self.threshold) for s in self.ballots[m]] for m in self.ballots}
