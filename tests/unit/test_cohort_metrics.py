"""Evaluation metrics on hand-made answer lists."""

from __future__ import annotations

import math

import pytest

from corl.cohort.metrics import accuracy, answer_entropy, distinct_count, majority_vote, mean


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
