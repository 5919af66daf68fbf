"""Grader reliability: probation, quarantine, and the hostile-grader scenario in judge mode."""

from __future__ import annotations

import json
import logging
import random

import pytest

from corl.config import ReliabilityConfig
from corl.rewards import (
    GraderReliability,
    chance_corrected_agreement,
    compute_rewards,
    judge_rewards,
    peer_votes_reliability_update,
)

HONEST = [f"honest{i}" for i in range(4)]
MEMBERS = ["alpha", "beta", "gamma", "delta"]


def _honest_batch(rng: random.Random, n: int, sigma: float = 0.15) -> list[dict[str, float]]:
    batch = []
    for _ in range(n):
        q = rng.random()
        batch.append({h: min(1.0, max(0.0, rng.gauss(q, sigma))) for h in HONEST})
    return batch


def test_new_graders_start_at_their_registered_weight() -> None:
    rel = GraderReliability()
    rel.register("member")
    rel.register("agent", probation=True)
    assert rel.weight("member") == 1.0
    assert rel.weight("agent") == pytest.approx(0.1)
    assert rel.weight("never-registered") == 0.0
    rel.register("agent")  # idempotent: re-registering does not lift probation
    assert rel.weight("agent") == pytest.approx(0.1)


def test_from_config_uses_the_run_settings() -> None:
    rel = GraderReliability.from_config(ReliabilityConfig(ema=0.3, probation_weight=0.2))
    rel.register("agent", probation=True)
    assert (rel.ema, rel.weight("agent")) == (0.3, pytest.approx(0.2))


@pytest.mark.parametrize(
    ("scores", "consensus", "expected"),
    [
        ([0.1, 0.5, 0.9], [0.1, 0.5, 0.9], 1.0),  # perfect
        ([1.0, 1.0, 1.0], [0.1, 0.5, 0.9], 0.0),  # constant: no better than chance
        ([0.9, 0.5, 0.1], [0.1, 0.5, 0.9], 0.0),  # anti-correlated: clipped at 0
        ([0.5, 0.5], [0.5, 0.5], 1.0),  # nothing to tell apart, and agrees
        ([0.2], [0.2], None),  # one response cannot be chance-corrected
    ],
)
def test_chance_corrected_agreement(scores: list[float], consensus: list[float], expected: float | None) -> None:
    got = chance_corrected_agreement(scores, consensus)
    assert got == (None if expected is None else pytest.approx(expected))


def test_probationary_honest_grader_earns_weight() -> None:
    rng = random.Random(1)
    rel = GraderReliability()
    for h in HONEST[:3]:
        rel.register(h)
    rel.register(HONEST[3], probation=True)
    for _ in range(40):
        rel.update(_honest_batch(rng, 32))
    newcomer, veteran = rel.weight(HONEST[3]), rel.weight(HONEST[0])
    assert newcomer > 0.4
    assert newcomer == pytest.approx(veteran, abs=0.1)
    assert not rel.quarantined


def test_probationary_bad_grader_never_gets_a_say(caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(2)
    rel = GraderReliability()
    for h in HONEST:
        rel.register(h)
    rel.register("spammer", probation=True)
    max_weight = 0.0
    with caplog.at_level(logging.WARNING, logger="corl.rewards.reliability"):
        for _ in range(25):
            batch = _honest_batch(rng, 32)
            for resp in batch:
                resp["spammer"] = rng.choice([0.0, 1.0])
            rel.update(batch)
            max_weight = max(max_weight, rel.weight("spammer"))
    assert max_weight < 0.15  # never climbs off probation
    assert "spammer" in rel.quarantined
    assert rel.weight("spammer") == 0.0
    assert any("spammer quarantined" in rec.getMessage() for rec in caplog.records)


def test_no_quarantine_before_min_observations() -> None:
    rel = GraderReliability(min_observations=5)
    rel.register("x", probation=True)
    for i in range(4):
        rel.observe({"x": 0.0})
        assert "x" not in rel.quarantined, i
    rel.observe({"x": 0.0})
    assert "x" in rel.quarantined


def test_weight_is_bounded_below_by_floor() -> None:
    rel = GraderReliability(floor=0.05, min_observations=10_000)
    rel.register("x")
    for _ in range(200):
        rel.observe({"x": 0.0})
    assert rel.weight("x") == pytest.approx(0.05)


def test_release_puts_a_grader_back_on_probation() -> None:
    rel = GraderReliability(min_observations=1, release_above=None)
    rel.register("x")
    rel.weights["x"] = 0.1
    rel.observe({"x": 0.0})
    assert rel.weight("x") == 0.0
    rel.release("x")
    assert rel.weight("x") == pytest.approx(0.1)


def test_quarantine_lifts_when_a_grader_recovers(caplog: pytest.LogCaptureFixture) -> None:
    rel = GraderReliability(min_observations=3, ema=0.5, release_above=0.4)
    rel.register("x")
    for _ in range(4):
        rel.observe({"x": 0.0})
    assert "x" in rel.quarantined
    with caplog.at_level(logging.WARNING, logger="corl.rewards.reliability"):
        rel.observe({"x": 1.0})  # 1 -> .5 -> .25 -> .125 -> .0625, then 0.53: above release_above
    assert "x" not in rel.quarantined and rel.weight("x") == pytest.approx(0.53125)
    assert any("released" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("relative", [True, False])
def test_a_cohort_of_weak_judges_is_not_all_quarantined(relative: bool) -> None:
    """Weak but honest graders keep their say; absolute agreement alone would silence them all."""
    rng = random.Random(6)
    rel = GraderReliability(relative=relative)
    for h in HONEST:
        rel.register(h)
    for _ in range(40):
        rel.update(_honest_batch(rng, 64, sigma=0.6))
    if relative:
        assert not rel.quarantined
        assert min(rel.effective_weights().values()) > 0.5
    else:
        assert rel.quarantined == set(HONEST)  # every reward would be `missing`: training stalls


def test_batches_where_nobody_beats_chance_are_skipped() -> None:
    rel = GraderReliability()
    for g in ("a", "b"):
        rel.register(g)
    constant = [{"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0}]
    assert rel.update(constant) == {}
    assert rel.observations == {"a": 0, "b": 0}


def test_snapshot_round_trips_through_json() -> None:
    rng = random.Random(3)
    rel = GraderReliability(min_observations=3)
    for h in HONEST:
        rel.register(h)
    rel.register("agent", probation=True)
    for _ in range(5):
        batch = _honest_batch(rng, 16)
        for resp in batch:
            resp["agent"] = 1.0
        rel.update(batch)
    snap = json.loads(json.dumps(rel.snapshot()))
    restored = GraderReliability.from_snapshot(snap)
    assert restored.snapshot() == rel.snapshot()
    assert restored.weight("agent") == rel.weight("agent")


def test_update_is_independent_of_response_order() -> None:
    rng = random.Random(4)
    batch = _honest_batch(rng, 20)
    a, b = GraderReliability(), GraderReliability()
    for rel in (a, b):
        for h in HONEST:
            rel.register(h)
    a.update(batch)
    b.update(list(reversed(batch)))
    assert a.weights == pytest.approx(b.weights)


@pytest.mark.parametrize("method", ["mean", "median", "trimmed_mean"])
def test_hostile_and_random_graders_cannot_move_rewards(method: str) -> None:
    """4 honest noisy graders + one that always says 1.0 + one that answers at random.

    Rewards combined with the online-learnt weights stay within 0.05 of the honest-only rewards,
    for every member, over the whole run (learning period included).
    """
    rng = random.Random(f"hostile-{method}")
    rel = GraderReliability()
    for g in [*HONEST, "hostile", "random"]:
        rel.register(g)
    honest_weights = {h: 1.0 for h in HONEST}
    totals = {m: [0.0, 0.0] for m in MEMBERS}
    for _ in range(60):
        grades = {}
        for m in MEMBERS:
            responses = _honest_batch(rng, 32)
            for resp in responses:
                resp["hostile"] = 1.0
                resp["random"] = rng.random()
            grades[m] = [responses[i : i + 8] for i in range(0, 32, 8)]  # 4 prompts x 8 samples
        learnt = judge_rewards(grades, rel.effective_weights(), method)  # type: ignore[arg-type]
        honest_only = judge_rewards(
            {m: [[{h: r[h] for h in HONEST} for r in p] for p in ps] for m, ps in grades.items()},
            honest_weights,
            method,  # type: ignore[arg-type]
        )
        for m in MEMBERS:
            totals[m][0] += sum(sum(row) for row in learnt[m])
            totals[m][1] += sum(sum(row) for row in honest_only[m])
        rel.update([resp for ps in grades.values() for p in ps for resp in p])
    n = 60 * 32
    for m in MEMBERS:
        assert abs(totals[m][0] - totals[m][1]) / n < 0.05, m
    assert {"hostile", "random"} <= rel.quarantined
    assert rel.weight("hostile") == 0.0
    assert all(rel.weight(h) > 0.4 for h in HONEST)


def test_members_that_disagree_with_the_cohort_lose_vote_weight() -> None:
    rng = random.Random(5)
    rel = GraderReliability()
    for m in MEMBERS:
        rel.register(m)
    for _ in range(30):
        truth = [str(rng.randint(0, 9)) for _ in range(16)]
        labels = {m: list(truth) for m in MEMBERS[:3]}
        labels["delta"] = [str(rng.randint(10, 19)) for _ in truth]  # always off
        agreements = peer_votes_reliability_update(rel, labels)
        assert agreements["alpha"] == 1.0 and agreements["delta"] == 0.0
    weights = rel.effective_weights()
    assert weights["alpha"] == pytest.approx(1.0)
    assert weights["delta"] < 0.2
    answers = {"alpha": [["1", "2"]], "beta": [["1", "1"]], "delta": [["2", "2"]]}
    out = compute_rewards("peer_agreement", answers, reliability=weights)
    assert out.rewards["alpha"][0][0] > 0.9  # beta's votes dominate delta's


def test_vote_agreement_is_relative_and_abstaining_is_not_disagreeing() -> None:
    rel = GraderReliability()
    labels: dict[str, list[str | None]] = {
        "a": ["1", "2", "3", "4"],
        "b": ["1", "2", "9", "8"],
        "c": ["1", None, None, None],  # parses rarely, but agrees when it does
    }
    used = peer_votes_reliability_update(rel, labels)
    # raw: a 2/4 (LOO of b, c: 1, 2, 9, 8), b 2/4, c 1/1 -> relative to the best (c)
    assert used == {"a": 0.5, "b": 0.5, "c": 1.0}
    assert rel.observations == {"a": 1, "b": 1, "c": 1}


def test_vote_grounded_agreement_trusts_graders_that_match_the_cohorts_answers() -> None:
    """The reference is the members' answer-level consensus: a grader scoring by it agrees fully;
    constant, random and inverted graders score about 0; unconfident prompts do not count."""
    from corl.rewards.reliability import vote_grounded_agreements

    rng = random.Random(3)
    answers: dict[str, list[list[str | None]]] = {m: [] for m in ("a", "b", "c")}
    grades: dict[str, list[list[dict[str, float]]]] = {m: [] for m in answers}
    for p in range(20):
        truth = str(p)
        for m in answers:
            row = [truth if rng.random() < 0.7 else str(100 + rng.randint(0, 9)) for _ in range(6)]
            answers[m].append(row)  # type: ignore[arg-type]
            graded = []
            for ans in row:
                right = ans == truth
                graded.append(
                    {"careful": float(right), "yes": 1.0, "liar": float(not right), "dice": rng.random(), m: 1.0}
                )
            grades[m].append(graded)
    got = vote_grounded_agreements(grades, answers)
    assert got["careful"] > 0.9
    assert got["yes"] == pytest.approx(0.0) and got["liar"] == 0.0 and got["dice"] < 0.2
    assert "a" not in got  # an author's grade of its own response never counts (and a, b, c only self-grade here)

    split = {m: [["1", "1", "2", "2"]] for m in answers}  # a tie: no confident consensus, nothing measured
    assert vote_grounded_agreements({m: [[{"careful": 1.0}] * 4] for m in answers}, split) == {}
