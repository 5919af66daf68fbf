"""Judge-mode rewards: robust weighted combination of grades and the never-your-own-judge rule."""

from __future__ import annotations

import random

import pytest

from corl.rewards import combine_grades, judge_rewards

EQUAL = {g: 1.0 for g in "abcdef"}


@pytest.mark.parametrize(
    ("scores", "weights", "method", "trim", "expected"),
    [
        ({"a": 0.2, "b": 0.4, "c": 0.9}, EQUAL, "mean", 0.2, 0.5),
        ({"a": 0.2, "b": 0.4}, {"a": 3.0, "b": 1.0}, "mean", 0.2, 0.25),
        ({"a": 0.2, "b": 0.4, "c": 0.9}, EQUAL, "median", 0.2, 0.4),
        ({"a": 0.2, "b": 0.4, "c": 0.9, "d": 1.0}, EQUAL, "median", 0.2, 0.65),  # even count: mid-average
        ({"a": 0.2, "b": 0.4, "c": 0.9}, {"a": 1.0, "b": 1.0, "c": 5.0}, "median", 0.2, 0.9),
        ({"a": 0.2, "b": 0.4, "c": 0.9}, {"a": 2.0, "b": 1.0, "c": 1.0}, "median", 0.2, 0.3),  # exact split
        ({"a": 0.0, "b": 0.1, "c": 0.5, "d": 0.9, "e": 1.0}, EQUAL, "trimmed_mean", 0.2, 0.5),
        ({"a": 0.0, "b": 0.1, "c": 0.5, "d": 0.9, "e": 1.0}, EQUAL, "trimmed_mean", 0.0, 0.5),
        # 20% of total weight 4 is 0.8 from each tail: 0.8 of a's 1.0 and 0.8 of d's 1.0 are cut
        ({"a": 0.0, "b": 0.5, "c": 0.5, "d": 1.0}, EQUAL, "trimmed_mean", 0.2, 0.5),
        # total 8, keep weight in [2, 6]: c keeps 1, d keeps 3 -> (0.6 + 3.0) / 4
        ({"a": 0.0, "b": 0.4, "c": 0.6, "d": 1.0}, {"a": 1, "b": 1, "c": 1, "d": 5}, "trimmed_mean", 0.25, 0.9),
    ],
)
def test_combine_grades(scores: dict, weights: dict, method: str, trim: float, expected: float) -> None:
    assert combine_grades(scores, weights, method, trim) == pytest.approx(expected)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["mean", "median", "trimmed_mean"])
def test_combine_grades_without_weighted_graders_is_none(method: str) -> None:
    assert combine_grades({}, EQUAL, method) is None  # type: ignore[arg-type]
    assert combine_grades({"a": 0.7}, {"a": 0.0}, method) is None  # type: ignore[arg-type]
    assert combine_grades({"zz": 0.7}, EQUAL, method) is None  # type: ignore[arg-type]  # unknown grader


@pytest.mark.parametrize("method", ["median", "trimmed_mean"])
def test_robust_methods_resist_one_extreme_grader(method: str) -> None:
    honest = {"a": 0.3, "b": 0.35, "c": 0.4, "d": 0.3}
    got = combine_grades({**honest, "bad": 1.0}, EQUAL | {"bad": 1.0}, method)  # type: ignore[arg-type]
    assert got is not None and abs(got - 0.33) < 0.05


def test_combine_grades_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="trim"):
        combine_grades({"a": 1.0}, EQUAL, "trimmed_mean", trim=0.5)
    with pytest.raises(ValueError, match="unknown combine method"):
        combine_grades({"a": 1.0}, EQUAL, "mode")  # type: ignore[arg-type]


def test_judge_rewards_ignore_the_authors_own_grade() -> None:
    grades = {
        "a": [[{"a": 1.0, "b": 0.2, "c": 0.4}, {"b": 0.0}]],
        "b": [[{"a": 0.5, "b": 1.0}, {"b": 1.0}]],  # second response: only its own grade
    }
    out = judge_rewards(grades, EQUAL)
    assert out["a"] == [[pytest.approx(0.3), 0.0]]
    assert out["b"] == [[0.5, 0.0]]
    assert judge_rewards(grades, EQUAL, missing=0.5)["b"][0][1] == 0.5


def _random_grades(rng: random.Random, names: list[str]) -> dict:
    return {
        author: [
            [{g: rng.random() for g in names if rng.random() < 0.8} for _ in range(rng.randint(1, 4))]
            for _ in range(rng.randint(1, 3))
        ]
        for author in names
    }


@pytest.mark.parametrize("method", ["mean", "median", "trimmed_mean"])
def test_invariant_own_grades_never_change_own_rewards(method: str) -> None:
    """Perturb everything a member graded (its own responses and its peers'): its rewards stay."""
    rng = random.Random(method)
    for _ in range(200):
        names = [f"m{i}" for i in range(rng.randint(2, 5))]
        weights = {g: rng.choice([0.0, 0.1, 1.0, 3.0]) for g in names}
        grades = _random_grades(rng, names)
        me = rng.choice(names)
        before = judge_rewards(grades, weights, method)  # type: ignore[arg-type]
        perturbed = {
            author: [
                [{g: (rng.random() if g == me else s) for g, s in resp.items()} | {me: rng.random()} for resp in prompt]
                for prompt in prompts
            ]
            for author, prompts in grades.items()
        }
        after = judge_rewards(perturbed, weights, method)  # type: ignore[arg-type]
        assert after[me] == before[me]
