"""What the aggregator learns as the run goes: grader reliabilities and the collapse guard's state.

One object, owned by the serving layer and handed to the round driver and the grading pool when
they are built. It is made durable with each round's commit (``snapshot``) and taken back on start
(``restore``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from corl.config import RewardConfig
from corl.rewards import GraderReliability, RoundOutcome
from corl.rewards.guard import CollapseGuard, GuardBounds, GuardSignals


class LearntState:
    def __init__(self, reward: RewardConfig, members: Iterable[str]) -> None:
        self.reliability = GraderReliability.from_config(reward.reliability)
        g = reward.guard
        self.hold = g.action == "hold"
        self.collapse = CollapseGuard(GuardBounds(**g.model_dump(exclude={"action"})))
        self._members = list(members)
        self._register_members()

    def _register_members(self) -> None:
        for m in self._members:
            self.reliability.register(m)

    def restore(self, learnt: Mapping[str, Any]) -> None:
        """Take back what a snapshot holds (the same objects stay shared with the pool and driver)."""
        if "reliability" in learnt:
            self.reliability.restore(learnt["reliability"])
        if "collapse" in learnt:
            self.collapse.restore(learnt["collapse"])
        self._register_members()

    def snapshot(self) -> dict[str, Any]:
        return {"reliability": self.reliability.snapshot(), "collapse": self.collapse.snapshot()}

    def observe(self, outcome: RoundOutcome) -> dict[str, bool]:
        """Learn from one graded round; returns whether each member's collapse guard has tripped."""
        self.reliability.observe_batch(outcome.grader_agreements)
        return {
            m: self.collapse.update(m, GuardSignals(o.distinct_rate, o.echo_share, o.formatted_share))
            for m, o in outcome.members.items()
        }

    def held(self) -> set[str]:
        """Members whose trainers get no more batches (the guard tripped, with ``action: hold``)."""
        return set(self.collapse.tripped) if self.hold else set()

    def weights(self) -> dict[str, float]:
        """Effective grader weights (quarantined graders count 0)."""
        return self.reliability.effective_weights()
