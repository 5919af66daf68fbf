"""The collapse guard: label-free signals and when it trips."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from corl.experiment.guard_replay import guard_table, replay
from corl.proto import MemberRoundStats, RoundStats
from corl.rewards.guard import CollapseGuard, GuardBounds, GuardSignals, breached, echo_share

GOOD = GuardSignals(distinct_rate=0.5, echo_share=0.05, formatted_share=0.95)


def test_echo_share_counts_answers_that_are_numbers_of_the_prompt() -> None:
    prompts = ["Calculate -89 - 98.", "Calculate 7 + 5."]
    answers = [["98", "-187", None], ["12", "7", "5"]]
    assert echo_share(prompts, answers) == pytest.approx(3 / 5)  # 98, 7, 5 of five valid answers
    assert echo_share(prompts, [[None], [None]]) == 0.0


def test_a_member_that_learns_the_answer_does_not_trip_it() -> None:
    """Fewer distinct answers is what learning looks like too: not read unless asked for."""
    learnt = GuardSignals(distinct_rate=0.1, echo_share=0.0, formatted_share=1.0)
    assert breached(GOOD, learnt, GuardBounds()) == []
    assert breached(GOOD, learnt, GuardBounds(distinct_fraction=0.5)) == ["distinct_rate"]


def test_each_signal_has_its_bound() -> None:
    b = GuardBounds(echo_rise=0.2, formatted_drop=0.3)
    assert breached(GOOD, GuardSignals(0.5, 0.26, 0.95), b) == ["echo_share"]
    assert breached(GOOD, GuardSignals(0.5, 0.24, 0.95), b) == []
    assert breached(GOOD, GuardSignals(0.5, 0.05, 0.6), b) == ["formatted_share"]


def test_it_trips_after_patience_rounds_of_a_windowed_breach_and_stays_tripped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    g = CollapseGuard(GuardBounds(warmup_rounds=2, window=2, patience=2))
    echo = GuardSignals(0.5, 0.9, 0.95)
    assert [g.update("a", GOOD) for _ in range(2)] == [False, False]  # the start
    assert g.start["a"] == GOOD
    assert g.update("a", GOOD) is False  # the window is not full yet
    assert g.update("a", echo) is False  # window mean 0.475 echo: breached once
    with caplog.at_level(logging.WARNING, logger="corl.rewards.guard"):
        assert g.update("a", echo) is True  # twice in a row: tripped
    assert g.tripped == {"a": ["echo_share"]}
    assert "collapse guard tripped for member a" in caplog.text
    assert g.update("a", GOOD) is True  # a tripped member stays tripped
    assert g.update("b", echo) is False  # b has its own start


def test_one_noisy_round_does_not_trip_it() -> None:
    g = CollapseGuard(GuardBounds(warmup_rounds=1, window=4, patience=2))
    g.update("a", GOOD)
    seq = [GOOD, GOOD, GOOD, GuardSignals(0.5, 0.8, 0.95), GOOD, GOOD, GOOD]
    assert not any(g.update("a", s) for s in seq)


def test_snapshot_round_trip_and_an_older_snapshot_starts_afresh() -> None:
    g = CollapseGuard(GuardBounds(warmup_rounds=1, window=2, patience=1))
    for s in (GOOD, GOOD, GuardSignals(0.5, 0.9, 0.9), GuardSignals(0.5, 0.9, 0.9)):
        g.update("a", s)
    g.update("b", GOOD)
    restored = CollapseGuard(GuardBounds(warmup_rounds=1, window=2, patience=1)).restore(
        json.loads(json.dumps(g.snapshot()))
    )
    assert restored.snapshot() == g.snapshot()
    assert restored.update("a", GOOD) is True
    old = {"collapse_fraction": 0.5, "start": {"a": 0.8}, "alarmed": ["a"]}
    assert CollapseGuard().restore(old).snapshot() == CollapseGuard().snapshot()


def test_replaying_recorded_rounds_finds_the_round_it_trips_at(
    tmp_path: Path, member_stats: Callable[..., MemberRoundStats]
) -> None:
    def rnd(r: int, echo: float) -> RoundStats:
        m = member_stats(echo_share=echo, formatted_share=1.0)
        steady = m.model_copy(update={"echo_share": 0.0})
        return RoundStats(
            round=r, created_at=0.0, members={"a": m, "b": steady}, missing=[], agreement={}, cohort_diversity=0.5
        )

    rounds = [rnd(r, 0.0 if r < 6 else 0.9) for r in range(12)]
    bounds = GuardBounds(warmup_rounds=3, window=2, patience=2)
    trips = replay(rounds, bounds, samples_per_prompt=8)
    assert trips["a"].round == 7 and trips["a"].signals == ("echo_share",)  # window breached at 6 and 7
    assert trips["b"].round is None
    run = tmp_path / "peer_pool-seed0"
    run.mkdir()
    (run / "rounds.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in rounds))
    table = guard_table([run], bounds, 8)
    assert "| peer_pool-seed0 | a | - | 0.00 / 1.00 | 7 | echo_share |" in table
