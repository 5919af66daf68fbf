"""Per-round diagnostics: diversity, agreement, label accuracy and the collapse alarm."""

from __future__ import annotations

import json
import math

import pytest

from corl.rewards import diagnostics as d
from corl.rewards import majority_ratio, reward_accuracy


@pytest.mark.parametrize(
    ("samples", "distinct", "entropy"),
    [
        (["1", "1", "1", "1"], 1, 0.0),
        (["1", "2", "1", "2"], 2, math.log(2)),
        (["1", "2", "3", "4"], 4, math.log(4)),
        (["1", None, "2", None], 2, math.log(2)),  # invalid answers are not an answer
        ([None, None], 0, 0.0),
        ([], 0, 0.0),
    ],
)
def test_answer_stats(samples: list[str | None], distinct: int, entropy: float) -> None:
    got = d.answer_stats(samples)
    assert got[0] == distinct
    assert got[1] == pytest.approx(entropy)


def test_diversity_is_mean_distinct_rate_and_entropy() -> None:
    rate, entropy = d.diversity([["1", "1", "1", "1"], ["1", "2", "3", "4"]])
    assert rate == pytest.approx((1 / 4 + 4 / 4) / 2)
    assert entropy == pytest.approx(math.log(4) / 2)
    assert d.diversity([]) == (0.0, 0.0)


def test_agreement_matrix() -> None:
    labels = {"a": ["1", "2", None, "4"], "b": ["1", "3", None, "4"], "c": [None, "2", "3", "5"]}
    m = d.agreement_matrix(labels)
    assert m["a"]["b"] == m["b"]["a"] == pytest.approx(2 / 4)
    assert m["a"]["c"] == pytest.approx(1 / 4)
    assert m["b"]["c"] == 0.0
    assert m["a"]["a"] == pytest.approx(3 / 4)  # diagonal: labelled fraction
    json.dumps(m)


def test_cohort_diversity_and_labelled_fraction() -> None:
    assert d.cohort_diversity({"a": ["1", "1"], "b": ["1", "2"]}) == pytest.approx((1 + 2) / 4)
    assert d.labelled_fraction(["1", None, None, "2"]) == 0.5
    assert d.labelled_fraction([]) == 0.0


@pytest.mark.parametrize(
    ("labels", "truth", "expected"),
    [
        (["1", "2", "3"], ["1", "2", "4"], 2 / 3),
        (["1", None, "3"], ["1", "2", None], 1.0),  # only prompts with both count
        ([None, None], ["1", "2"], None),
        (["1"], [None], None),
    ],
)
def test_label_accuracy(labels: list[str | None], truth: list[str | None], expected: float | None) -> None:
    got = d.label_accuracy(labels, truth)
    assert got == (None if expected is None else pytest.approx(expected))


def test_reward_accuracy_counts_rewards_that_say_what_the_data_set_says() -> None:
    answers = [["1", "2", None], ["5", "5", "5"], ["7", "8", "9"]]
    rewards = [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    truth = ["1", "5", None]  # the third prompt has no dataset answer: not counted
    # prompt 0: right-and-rewarded, wrong-and-not, unparseable-and-not: 3 hits; prompt 1: 0 hits of 3
    assert reward_accuracy(answers, rewards, truth) == 3 / 6
    assert reward_accuracy(answers, rewards, [None, None, None]) is None


def test_majority_ratio_is_the_plurality_share_per_prompt() -> None:
    assert majority_ratio([["1", "1", "2", None], ["3", "3", "3", "3"]]) == (2 / 4 + 1.0) / 2
    assert majority_ratio([[None, None]]) == 0.0


def test_label_share_is_how_often_a_members_answer_was_the_others_label() -> None:
    pseudo = {"a": ["1", "2", None, "4"], "b": ["1", "3", "3", None], "ops": ["1", "2", "3", "4"]}
    labels = {"a": ["1", "3", "3", None], "b": ["1", "2", None, "4"], "ops": [None, None, None, None]}
    shares = d.label_share(pseudo, labels)
    # ops: 5 of the 6 labels a and b got equal its own answer (a's second label is 3, it said 2);
    # a: all 3 of b's labels; b: all 3 of a's (ops got no label: it counts for no one).
    assert shares == {"ops": pytest.approx(5 / 6), "a": 1.0, "b": 1.0}
    assert d.label_share({"a": ["1"], "b": ["1"]}, {"a": [None], "b": [None]}) == {"a": None, "b": None}


def test_response_tokens_come_from_token_ids_or_an_endpoints_usage() -> None:
    from corl.proto import GenerateResponse
    from corl.rewards.round import response_tokens

    sample = {"text": "42", "token_ids": [5, 6, 0], "logprobs": [-1.0] * 3, "finish_reason": "stop"}
    served = GenerateResponse.model_validate(
        {"model": "a", "weight_version": 3, "results": [{"prompt": "p", "prompt_token_ids": [1], "samples": [sample]}]}
    )
    text_only = {**sample, "token_ids": [], "logprobs": []}
    usage = {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}
    outside = GenerateResponse.model_validate(
        {
            "model": "ops",
            "weight_version": 0,
            "results": [{"prompt": "p", "prompt_token_ids": [], "samples": [text_only, text_only]}],
            "usage": usage,
        }
    )
    assert response_tokens(served) == 3 and response_tokens(outside) == 7
