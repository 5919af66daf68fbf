"""Evaluation metrics on hand-made answer lists."""

from __future__ import annotations

import math

import pytest

from corl.cohort.metrics import accuracy, answer_entropy, cohen_kappa, distinct_count, majority_vote, mean


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (["5", "5", "7"], "5"),
        (["7", None, None, None, "7", "3"], "7"),  # invalid answers never win, however many
        (["5", "7"], None),  # tie at the top: no majority
        (["5", "5", "7", "7", "1"], None),
        ([None, None], None),
        ([], None),
        (["9"], "9"),
    ],
)
def test_majority_vote(answers: list[str | None], expected: str | None) -> None:
    assert majority_vote(answers) == expected


@pytest.mark.parametrize(
    ("answers", "expected"),
    [(["1", "1", "1"], 1), (["1", "2", "3", None], 3), ([None, None], 0), ([], 0)],
)
def test_distinct_count(answers: list[str | None], expected: int) -> None:
    assert distinct_count(answers) == expected


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (["4"] * 8, 0.0),
        (["1", "2"] * 4, math.log(2)),
        ([str(i) for i in range(8)], math.log(8)),
        (["1", "1", "1", "2"], -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))),
        (["1", None, "2", None], math.log(2)),  # over valid answers only
        ([None] * 8, 0.0),
    ],
)
def test_answer_entropy_in_nats(answers: list[str | None], expected: float) -> None:
    assert answer_entropy(answers) == pytest.approx(expected)


def test_accuracy_counts_only_valid_matches() -> None:
    assert accuracy(["1", "2", None, "4"], ["1", "3", None, "4"]) == 0.5
    assert accuracy([], []) == 0.0
    with pytest.raises(ValueError):
        accuracy(["1"], ["1", "2"])


def test_mean() -> None:
    assert mean([1.0, 2.0, 6.0]) == 3.0 and mean([]) == 0.0


def test_cohen_kappa_is_one_for_the_same_errors_zero_for_independent_ones_and_negative_for_opposite() -> None:
    a = [True, True, False, False]
    assert cohen_kappa(a, a) == pytest.approx(1.0)
    assert cohen_kappa(a, [not x for x in a]) == pytest.approx(-1.0)
    # Right on half of each other's: observed agreement 0.5 is exactly chance (0.5 * 0.5 * 2).
    assert cohen_kappa(a, [True, False, True, False]) == pytest.approx(0.0)
    # 8 problems, accuracies 0.5 and 0.25, agreeing on 6: (0.75 - 0.5) / 0.5.
    b = [True, True, True, True, False, False, False, False]
    c = [True, True, False, False, False, False, False, False]
    assert cohen_kappa(b, c) == pytest.approx(0.5)


def test_cohen_kappa_is_undefined_when_chance_agreement_is_total_and_refuses_unequal_lengths() -> None:
    assert cohen_kappa([True, True], [True, True]) is None
    assert cohen_kappa([], []) is None
    with pytest.raises(ValueError):
        cohen_kappa([True], [True, False])
