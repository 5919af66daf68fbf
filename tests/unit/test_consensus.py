"""The cohort's consensus as a reward for outside responses (``corl.rewards.consensus``)."""

from __future__ import annotations

import pytest

from corl.rewards import consensus


def test_consensus_is_the_plurality_of_member_pseudo_labels() -> None:
    answers: dict[str, list[str | None]] = {
        "a": ["46", "46", "12", None],
        "b": ["46", "7", "46", "46"],
        "c": ["9", "9", "9", "46"],
    }
    c = consensus.cohort_consensus(answers)
    assert c.pseudo_labels == {"a": "46", "b": "46", "c": "9"}
    assert c.answer == "46"
    # Shares count every sample, unparseable ones in the denominator: 6 of 12 say 46.
    assert c.shares["46"] == pytest.approx(6 / 12)
    assert consensus.consensus_rewards(c, ["46", "9", None, " 46"]) == [1.0, 0.0, 0.0, 0.0]
    assert consensus.agreement_scores(c, ["46", "9", None, "1000"]) == pytest.approx([0.5, 3 / 12, 0.0, 0.0])


def test_tied_members_give_no_consensus_and_no_reward() -> None:
    c = consensus.cohort_consensus({"a": ["1", "1"], "b": ["2", "2"]})
    assert c.answer is None and not c.labelled
    assert consensus.consensus_rewards(c, ["1", "2", None]) == [0.0, 0.0, 0.0]
    assert consensus.agreement_scores(c, ["1"]) == [0.5]  # the soft score still sees the split


def test_threshold_and_zero_weight_members() -> None:
    answers = {"a": ["1", "2", "3", "1"], "b": ["5", "5", "5", "5"], "c": ["5", "6", "7", "8"]}
    # a's plurality holds only 2/4 of its samples: with threshold 0.6 it has no label; b decides.
    assert consensus.cohort_consensus(answers, threshold=0.6).answer == "5"
    # A quarantined member (weight 0) has no say in the plurality nor in the shares.
    votes = {"a": ["1"] * 4, "b": ["1"] * 4, "c": ["9"] * 4, "d": ["9"] * 4}
    c = consensus.cohort_consensus(votes, weights={"c": 0.0, "d": 0.0})
    assert c.answer == "1" and c.shares == {"1": 1.0}


def test_label_rewards_compare_canonical_answers() -> None:
    assert consensus.label_rewards(["46", None, "3"], ["46", "46", "4"]) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="2 labels for 3 responses"):
        consensus.label_rewards(["1", "2", "3"], ["1", "2"])


@pytest.mark.parametrize(
    ("query", "prompt", "response"),
    [
        ("12+34=46", "12+34=", "46"),
        ("12+34=46</s>", "12+34=", "46"),
        ("<|im_start|>user\n12+34=<|im_end|>\n46<|im_end|><|endoftext|>", "<|im_start|>user\n12+34=<|im_end|>\n", "46"),
        ("<s> 12+34=46", "12+34=", "46"),  # a BOS the prompt string lacks: cut after the prompt's last occurrence
        ("46", "99+99=", "46"),  # prompt not found: the whole query is the response
    ],
)
def test_split_query_recovers_the_response(query: str, prompt: str, response: str) -> None:
    markers = ["</s>", "<|im_end|>", "<|endoftext|>"]
    assert consensus.split_query(query, prompt, markers) == response


def test_strip_end_markers_leaves_other_text() -> None:
    assert consensus.strip_end_markers("46 <eos> <eos>", ["<eos>"]) == "46"
    assert consensus.strip_end_markers("4<eos>6", ["<eos>"]) == "4<eos>6"
