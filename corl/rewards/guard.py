"""The collapse guard: label-free signals that a member is collapsing, and the decision to hold it.

A label-free run has no labels to notice a collapse with. What it has is each member's own answers:
a member that collapses onto a cheap consensus answers the same few things (its distinct-answer rate
falls), copies numbers out of the question (its *echo share* rises: on the three-family study's
collapsed seed, Gemma-3 and SmolLM2 converged on answering the question's last number), or stops
answering in the asked form (its formatted share falls). A falling distinct-answer rate is read only
when asked: a member that learns the right answer gives fewer distinct answers too. Each signal is
read per round, averaged over a window of rounds and compared with the member's own start (the mean
of its first rounds).

When a signal stays past its bound for ``patience`` rounds in a row the guard trips for that member,
and stays tripped: with ``action: hold`` the member keeps answering (and voting) but its trainer gets
no more batches, so its weights stay at the version that tripped the guard instead of training
further into the collapse. Pure state, snapshotted with the round so a restarted aggregator goes on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corl.tasks import literal

logger = logging.getLogger(__name__)


def echo_share(prompts: Sequence[str], answers: Sequence[Sequence[str | None]]) -> float:
    """Share of a member's valid answers that are a number written in their prompt (0 when none is
    valid). On arithmetic a right answer rarely is one; a member copying operands makes it rise."""
    hits = total = 0
    for prompt, samples in zip(prompts, answers, strict=True):
        written = {literal.canonical_number(value) for value, _ in literal.numbers(prompt)}
        for a in samples:
            if a is not None:
                total += 1
                hits += a in written
    return hits / total if total else 0.0


@dataclass(frozen=True)
class GuardSignals:
    """One member's label-free collapse signals for one round."""

    distinct_rate: float  # distinct valid answers / samples, averaged over prompts
    echo_share: float  # share of valid answers copied from the prompt
    formatted_share: float  # share of samples in the asked form


@dataclass(frozen=True)
class GuardBounds:
    warmup_rounds: int = 3  # rounds whose mean is the member's start
    window: int = 4  # rounds each signal is averaged over before it is compared
    patience: int = 2  # consecutive rounds past a bound before the guard trips
    distinct_fraction: float | None = None  # trips below this fraction of the start's rate (None: not read)
    echo_rise: float = 0.2  # trips when the echo share is this much above the start's
    formatted_drop: float = 0.3  # trips when the formatted share is this much below the start's


def breached(start: GuardSignals, now: GuardSignals, bounds: GuardBounds) -> list[str]:
    """The signals of ``now`` past their bound relative to ``start`` (empty: none)."""
    out = []
    if bounds.distinct_fraction is not None and now.distinct_rate < bounds.distinct_fraction * start.distinct_rate:
        out.append("distinct_rate")
    if now.echo_share > start.echo_share + bounds.echo_rise:
        out.append("echo_share")
    if now.formatted_share < start.formatted_share - bounds.formatted_drop:
        out.append("formatted_share")
    return out


def _mean(rows: Sequence[GuardSignals]) -> GuardSignals:
    n = len(rows)
    return GuardSignals(
        distinct_rate=sum(r.distinct_rate for r in rows) / n,
        echo_share=sum(r.echo_share for r in rows) / n,
        formatted_share=sum(r.formatted_share for r in rows) / n,
    )


@dataclass
class CollapseGuard:
    """Per-member start, recent window and trip state; ``update`` once per round per member."""

    bounds: GuardBounds = field(default_factory=GuardBounds)
    start: dict[str, GuardSignals] = field(default_factory=dict)
    tripped: dict[str, list[str]] = field(default_factory=dict)  # member -> the signals that tripped it
    _seen: dict[str, deque[GuardSignals]] = field(default_factory=dict)
    _warmup: dict[str, list[GuardSignals]] = field(default_factory=dict)
    _streak: dict[str, int] = field(default_factory=dict)
    last: dict[str, list[str]] = field(default_factory=dict)  # member -> signals past their bound now

    def update(self, member: str, signals: GuardSignals) -> bool:
        """Take one round's signals; returns whether the member's guard is tripped (now or before)."""
        if member in self.tripped:
            return True
        b = self.bounds
        if member not in self.start:
            warm = self._warmup.setdefault(member, [])
            warm.append(signals)
            if len(warm) >= b.warmup_rounds:
                self.start[member] = _mean(warm)
                del self._warmup[member]
            return False
        window = self._seen.setdefault(member, deque(maxlen=b.window))
        window.append(signals)
        now = breached(self.start[member], _mean(list(window)), b) if len(window) == b.window else []
        self.last[member] = now
        self._streak[member] = self._streak.get(member, 0) + 1 if now else 0
        if self._streak[member] >= b.patience:
            self.tripped[member] = now
            logger.warning("collapse guard tripped for member %s: %s past their bounds", member, ", ".join(now))
            return True
        return False

    def snapshot(self) -> dict[str, Any]:
        return {
            "start": {m: vars(s) for m, s in self.start.items()},
            "tripped": dict(self.tripped),
            "seen": {m: [vars(s) for s in q] for m, q in self._seen.items()},
            "warmup": {m: [vars(s) for s in w] for m, w in self._warmup.items()},
            "streak": dict(self._streak),
        }

    def restore(self, data: Mapping[str, Any]) -> CollapseGuard:
        if not all(isinstance(v, Mapping) for v in data.get("start", {}).values()):
            return self  # an earlier version's distinct-rate alarm: the guard starts afresh
        self.start = {m: GuardSignals(**s) for m, s in data.get("start", {}).items()}
        self.tripped = {m: list(v) for m, v in data.get("tripped", {}).items()}
        self._seen = {
            m: deque((GuardSignals(**s) for s in q), maxlen=self.bounds.window) for m, q in data.get("seen", {}).items()
        }
        self._warmup = {m: [GuardSignals(**s) for s in w] for m, w in data.get("warmup", {}).items()}
        self._streak = {m: int(v) for m, v in data.get("streak", {}).items()}
        return self
