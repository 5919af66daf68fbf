"""Online reliability of graders (cohort members or external agents).

A grader's weight is an exponential moving average of its *chance-corrected* agreement with a
reference: by default the cohort's answer-level vote consensus (``vote_grounded_agreements``),
else the leave-one-out consensus of the other graders' scores (``grade_agreements``). Agreement is
``1 - D_obs / D_exp``, where ``D_obs`` is its mean absolute distance to the reference on the
responses it graded and ``D_exp`` the same distance with responses paired at random
(Krippendorff-style). Raw ``1 - |score - consensus|`` would give
a grader that always answers 1.0 about 0.5 and a random one about 0.67; chance correction gives
both about 0, while honest noisy graders keep a clearly positive weight.

Agreement is then taken relative to the best grader of the batch (``relative``), because what
matters is who to trust *among* these graders: a cohort of weak judges on a hard task all have
low absolute agreement, and quarantining all of them would stop training. A batch where nobody
beats chance by ``min_informative`` teaches nothing and is skipped. Quarantine has hysteresis: a
quarantined grader keeps being measured and is released once its weight climbs back to
``release_above`` (members improve during training). ``combine_grades`` normalises weights.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from corl.rewards.inputs import plurality
from corl.rewards.judge import weighted_median

if TYPE_CHECKING:
    from corl.config import ReliabilityConfig

logger = logging.getLogger(__name__)

_EPS = 1e-9
_PAIRS_EXACT = 1024  # above this many responses, D_exp is estimated from a fixed set of shifts


def chance_corrected_agreement(scores: Sequence[float], consensus: Sequence[float]) -> float | None:
    """``1 - D_obs / D_exp`` clipped to [0, 1]; ``None`` with fewer than two responses."""
    s = np.asarray(scores, dtype=float)
    c = np.asarray(consensus, dtype=float)
    n = len(s)
    if n < 2:
        return None
    d_obs = float(np.abs(s - c).mean())
    if n <= _PAIRS_EXACT:
        diff = np.abs(s[:, None] - c[None, :])
        d_exp = float((diff.sum() - np.trace(diff)) / (n * (n - 1)))
    else:
        shifts = np.linspace(1, n - 1, 64).astype(int)
        d_exp = float(np.mean([np.abs(s - np.roll(c, int(k))).mean() for k in shifts]))
    if d_exp < _EPS:
        # Nothing to tell apart (every response got the same consensus and score): agreeing is right.
        return 1.0 if d_obs < _EPS else 0.0
    return float(min(1.0, max(0.0, 1.0 - d_obs / d_exp)))


@dataclass
class GraderReliability:
    """Per-grader weights learnt online, with probation for newcomers and quarantine for the unreliable."""

    ema: float = 0.1
    floor: float = 0.05
    probation_weight: float = 0.1
    quarantine_below: float = 0.2
    initial_weight: float = 1.0
    min_observations: int = 20  # updates with a measured agreement before quarantine can trigger
    consensus: Literal["median", "mean"] = "median"
    relative: bool = True  # agreement divided by the batch's best agreement
    min_informative: float = 0.05  # best agreement below this: the batch is skipped
    release_above: float | None = 0.4  # quarantined grader released at this weight (None: never)
    weights: dict[str, float] = field(default_factory=dict)
    quarantined: set[str] = field(default_factory=set)
    observations: dict[str, int] = field(default_factory=dict)
    probation: set[str] = field(default_factory=set)  # registered on probation (informational)
    last_agreement: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: ReliabilityConfig, **kw: Any) -> GraderReliability:
        return cls(
            ema=cfg.ema,
            floor=cfg.floor,
            probation_weight=cfg.probation_weight,
            quarantine_below=cfg.quarantine_below,
            **kw,
        )

    def register(self, name: str, probation: bool = False) -> None:
        """Add a grader (idempotent: a known grader keeps its weight and history)."""
        if name in self.weights:
            return
        self.weights[name] = self.probation_weight if probation else self.initial_weight
        self.observations[name] = 0
        if probation:
            self.probation.add(name)

    def weight(self, name: str) -> float:
        """Current weight; 0 for quarantined or unknown graders."""
        if name in self.quarantined:
            return 0.0
        return self.weights.get(name, 0.0)

    def effective_weights(self) -> dict[str, float]:
        return {g: self.weight(g) for g in self.weights}

    def release(self, name: str) -> None:
        """Lift a quarantine (an operator's decision); the grader restarts on probation."""
        self.quarantined.discard(name)
        self.weights[name] = self.probation_weight
        self.observations[name] = 0
        self.probation.add(name)

    def observe(self, agreements: Mapping[str, float]) -> None:
        """One EMA step per grader towards its measured agreement in [0, 1]."""
        for g, a in agreements.items():
            self.register(g, probation=True)
            w = (1.0 - self.ema) * self.weights[g] + self.ema * float(a)
            self.weights[g] = max(self.floor, w)
            self.observations[g] += 1
            self.last_agreement[g] = float(a)
            if g in self.quarantined:
                if self.release_above is not None and self.weights[g] >= self.release_above:
                    self.quarantined.discard(g)
                    logger.warning("grader %s released from quarantine: weight %.3f", g, self.weights[g])
            elif self.observations[g] >= self.min_observations and self.weights[g] < self.quarantine_below:
                self.quarantined.add(g)
                logger.warning(
                    "grader %s quarantined: weight %.3f < %.3f after %d observations",
                    g,
                    self.weights[g],
                    self.quarantine_below,
                    self.observations[g],
                )

    def observe_batch(self, agreements: Mapping[str, float]) -> dict[str, float]:
        """``observe`` after the relative scaling and the informativeness check; returns what was used."""
        if not agreements:
            return {}
        best = max(agreements.values())
        if best < self.min_informative:
            return {}
        used = {g: a / best for g, a in agreements.items()} if self.relative else dict(agreements)
        self.observe(used)
        return used

    def update(self, grades: Sequence[Mapping[str, float]]) -> dict[str, float]:
        """Learn from one batch of grades, each ``{grader: score}`` for one response: register new
        graders on probation, measure agreements with the weights from before this batch
        (``grade_agreements``) and take one ``observe_batch`` step. Returns the agreement used."""
        for by_grader in grades:
            for g in by_grader:
                self.register(g, probation=True)
        return self.observe_batch(grade_agreements(grades, self.weights, self.consensus))

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state, for stats and persistence."""
        return {
            "config": {
                "ema": self.ema,
                "floor": self.floor,
                "probation_weight": self.probation_weight,
                "quarantine_below": self.quarantine_below,
                "initial_weight": self.initial_weight,
                "min_observations": self.min_observations,
                "consensus": self.consensus,
                "relative": self.relative,
                "min_informative": self.min_informative,
                "release_above": self.release_above,
            },
            "weights": dict(self.weights),
            "effective_weights": self.effective_weights(),
            "quarantined": sorted(self.quarantined),
            "observations": dict(self.observations),
            "probation": sorted(self.probation),
            "last_agreement": dict(self.last_agreement),
        }

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any]) -> GraderReliability:
        known = {f.name for f in fields(cls)}
        config = {k: v for k, v in data.get("config", {}).items() if k in known}
        return cls(**config).restore(data)

    def restore(self, data: Mapping[str, Any]) -> GraderReliability:
        """Take the learnt state (not the configuration) of a ``snapshot``, in place; returns self."""
        self.weights = {k: float(v) for k, v in data.get("weights", {}).items()}
        self.quarantined = set(data.get("quarantined", []))
        self.observations = {k: int(v) for k, v in data.get("observations", {}).items()}
        self.probation = set(data.get("probation", []))
        self.last_agreement = {k: float(v) for k, v in data.get("last_agreement", {}).items()}
        return self


def grade_agreements(
    grades: Sequence[Mapping[str, float]],
    weights: Mapping[str, float],
    consensus: Literal["median", "mean"] = "median",
) -> dict[str, float]:
    """Each grader's chance-corrected agreement with the leave-one-out consensus of the other graders
    (weighted by ``weights``) over the responses of one batch. The order of responses does not
    matter; quarantined graders count at their (floor-bounded) weight, so a cohort that is all
    quarantined can earn its way back. Graders with fewer than two comparable responses are absent."""
    pairs: dict[str, tuple[list[float], list[float]]] = {}
    for by_grader in grades:
        scored = [(g, float(s), float(weights.get(g, 0.0))) for g, s in by_grader.items()]
        for g, s, _ in scored:
            others = [(t, w) for h, t, w in scored if h != g and w > 0.0]
            if not others:
                continue
            mine, cons = pairs.setdefault(g, ([], []))
            mine.append(s)
            if consensus == "mean":
                cons.append(sum(t * w for t, w in others) / sum(w for _, w in others))
            else:
                cons.append(weighted_median(sorted(others)))
    return _agreements(pairs)


def _agreements(pairs: Mapping[str, tuple[list[float], list[float]]]) -> dict[str, float]:
    """Each grader's chance-corrected agreement between its scores and their references."""
    found = {g: chance_corrected_agreement(mine, ref) for g, (mine, ref) in pairs.items()}
    return {g: a for g, a in found.items() if a is not None}


def vote_consensus(
    answers: Mapping[str, Sequence[Sequence[str | None]]], prompt: int, *, leave_out: str | None, min_share: float
) -> str | None:
    """The plurality of every member's valid answers to ``prompt`` (``leave_out``'s excluded), when
    it holds at least ``min_share`` of those votes and is not tied; else None."""
    votes = [a for m, rows in answers.items() if m != leave_out for a in rows[prompt] if a is not None]
    top = plurality(votes)
    if top is None or votes.count(top) < min_share * len(votes):
        return None
    return top


def vote_grounded_agreements(
    grades: Mapping[str, Sequence[Sequence[Mapping[str, float]]]],
    answers: Mapping[str, Sequence[Sequence[str | None]]],
    *,
    min_share: float = 0.5,
) -> dict[str, float]:
    """Each judge's chance-corrected agreement with the cohort's *vote* consensus, without labels.

    ``grades``: author -> [prompt][sample] -> {grader: score}; ``answers``: member -> [prompt][sample]
    canonical answers. A response's verdict is 1 when its answer equals the plurality of the members'
    answers to its prompt, else 0; only prompts where that plurality is confident (``min_share`` of
    the valid votes) count. A member judge is checked against the consensus of the *other*
    members' answers. The answer-level consensus is right far more often than weak judges' scores,
    so a careful outside grader earns weight even when the members judge poorly, while constant,
    random or inverted graders score about 0 (chance correction). Authors' grades of their own
    responses are ignored.
    """
    cache: dict[tuple[int, str | None], str | None] = {}

    def consensus(p: int, grader: str) -> str | None:
        key = (p, grader if grader in answers else None)
        if key not in cache:
            cache[key] = vote_consensus(answers, p, leave_out=key[1], min_share=min_share)
        return cache[key]

    pairs: dict[str, tuple[list[float], list[float]]] = {}
    for author, prompts in grades.items():
        for p, samples in enumerate(prompts):
            for s, by_grader in enumerate(samples):
                answer = answers[author][p][s]
                for g, score in by_grader.items():
                    c = consensus(p, g) if g != author else None
                    if c is None:
                        continue
                    mine, verdicts = pairs.setdefault(g, ([], []))
                    mine.append(float(score))
                    verdicts.append(1.0 if answer == c else 0.0)
    return _agreements(pairs)


def peer_vote_agreements(pseudo_labels: Mapping[str, Sequence[str | None]]) -> dict[str, float]:
    """Vote modes: each member's agreement with the leave-one-out plurality of the others' labels.

    Agreement is the fraction of prompts where both the member and the others have a label and
    the two are equal (abstaining is not disagreeing: early in training most samples do not
    parse). Feed it to ``GraderReliability.observe_batch`` (relative to the best member); with 2
    members both get the same value."""
    members = list(pseudo_labels)
    agreements: dict[str, float] = {}
    for m in members:
        others = [o for o in members if o != m]
        if not others:
            continue
        hits = total = 0
        for p, own in enumerate(pseudo_labels[m]):
            if own is None:
                continue
            loo = plurality([pseudo_labels[o][p] for o in others])
            if loo is None:
                continue
            total += 1
            hits += int(own == loo)
        if total:
            agreements[m] = hits / total
    return agreements


def peer_votes_reliability_update(
    reliability: GraderReliability, pseudo_labels: Mapping[str, Sequence[str | None]]
) -> dict[str, float]:
    """``peer_vote_agreements`` then one ``observe_batch`` step; returns the agreement used."""
    return reliability.observe_batch(peer_vote_agreements(pseudo_labels))
