"""Vote-style rewards on hand-made rounds, and the two reward invariants on many random rounds."""

from __future__ import annotations

import random
from typing import Any

import pytest

from corl.rewards import PEER_VOTE_MODES, REWARD_MODES, Answers, compute_rewards, plurality, pseudo_label, supervisors

# --- pseudo-labels --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answers", "threshold", "expected"),
    [
        (["4", "4", "5", "4"], 0.0, "4"),
        (["4", "5", "5", None], 0.0, "5"),
        (["4", "4", "5", "5"], 0.0, None),  # tie at the top
        ([None, None, None], 0.0, None),  # nothing parseable
        ([], 0.0, None),
        (["7"], 0.0, "7"),
        (["4", "4", "5", "6"], 0.5, "4"),  # 2/4 reaches the threshold
        (["4", "4", "5", "6"], 0.6, None),
        (["4", "4", None, None], 0.6, None),  # share is over all G samples, invalid ones included
        (["4", "4", "4", None], 0.75, "4"),
    ],
)
def test_pseudo_label(answers: list[str | None], threshold: float, expected: str | None) -> None:
    assert pseudo_label(answers, threshold) == expected


def test_plurality_ignores_none_votes() -> None:
    assert plurality([None, None, "a"]) == "a"
    assert plurality(["a", "b", None, None]) is None


# --- peer_label ---------------------------------------------------------------------------


def test_two_members_are_each_others_label() -> None:
    answers: Answers = {
        "a": [["1", "1", "2", None], ["3", "3", "3", "3"]],
        "b": [["2", "2", "2", "1"], ["3", "4", "4", "5"]],
    }
    out = compute_rewards("peer_label", answers)
    assert out.pseudo_labels == {"a": ["1", "3"], "b": ["2", "4"]}
    assert out.labels == {"a": ["2", "4"], "b": ["1", "3"]}
    assert out.rewards["a"] == [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert out.rewards["b"] == [[0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]


def test_three_members_majority_of_peers_and_ties_discarded() -> None:
    answers: Answers = {
        "a": [["1", "1", "1"], ["5", "5", "6"]],
        "b": [["1", "1", "2"], ["6", "6", "6"]],
        "c": [["2", "2", "1"], ["7", "7", "5"]],
    }
    out = compute_rewards("peer_label", answers)
    # prompt 0: pseudo a=1 b=1 c=2 ; prompt 1: a=5 b=6 c=7
    assert out.labels["a"] == [None, None]  # peers b=1, c=2 tie; peers b=6, c=7 tie
    assert out.labels["b"] == [None, None]
    assert out.labels["c"] == ["1", None]  # peers a=1, b=1 agree
    assert out.rewards["a"] == [[0.0] * 3, [0.0] * 3]
    assert out.rewards["c"] == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]


def test_four_members_plurality_over_three_peers() -> None:
    answers: Answers = {
        "a": [["9", "9"]],
        "b": [["1", "1"]],
        "c": [["1", None]],
        "d": [["2", "2"]],
    }
    out = compute_rewards("peer_label", answers)
    assert out.labels == {"a": ["1"], "b": [None], "c": [None], "d": ["1"]}
    # b's peers: a=9, c=1, d=2 -> three-way tie -> no label
    assert out.rewards["a"] == [[0.0, 0.0]]
    assert out.rewards["d"] == [[0.0, 0.0]]


def test_unlabelled_peers_do_not_vote() -> None:
    answers: Answers = {
        "a": [["1", "1"]],
        "b": [["3", "3"]],
        "c": [[None, None]],  # no pseudo-label
    }
    out = compute_rewards("peer_label", answers)
    assert out.labels["a"] == ["3"]  # b's label alone; c abstains
    assert out.labels["c"] == [None]  # a=1 and b=3 tie


def test_threshold_removes_unconfident_peer_labels() -> None:
    answers: Answers = {"a": [["1", "2", "3", "1"]], "b": [["4", "4", "4", "5"]]}
    loose = compute_rewards("peer_label", answers, threshold=0.0)
    strict = compute_rewards("peer_label", answers, threshold=0.75)
    assert loose.labels == {"a": ["4"], "b": ["1"]}
    assert strict.labels == {"a": ["4"], "b": [None]}  # a's top share 2/4 < 0.75
    assert strict.rewards["b"] == [[0.0, 0.0, 0.0, 0.0]]
    assert strict.rewards["a"] == [[0.0, 0.0, 0.0, 0.0]]  # a answered no 4s


def test_invalid_answers_never_rewarded_even_when_unlabelled_peers() -> None:
    answers: Answers = {"a": [[None, "2", None]], "b": [["2", "2", None]]}
    for mode in ("peer_label", "peer_agreement", "self_vote"):
        assert compute_rewards(mode, answers).rewards["a"][0][0] == 0.0
        assert compute_rewards(mode, answers).rewards["a"][0][2] == 0.0


# --- ring topology --------------------------------------------------------------------------


def test_ring_supervises_by_predecessor_only() -> None:
    answers: Answers = {
        "a": [["1", "1"]],
        "b": [["2", "2"]],
        "c": [["3", "3"]],
    }
    out = compute_rewards("peer_label", answers, topology="ring", order=["a", "b", "c"])
    assert out.labels == {"a": ["3"], "b": ["1"], "c": ["2"]}
    reversed_ring = compute_rewards("peer_label", answers, topology="ring", order=["c", "b", "a"])
    assert reversed_ring.labels == {"a": ["2"], "b": ["3"], "c": ["1"]}


def test_ring_skips_absent_members() -> None:
    answers: Answers = {"a": [["1"]], "c": [["3"]], "d": [["4"]]}  # b is down this round
    out = compute_rewards("peer_label", answers, topology="ring", order=["a", "b", "c", "d"])
    assert out.labels == {"a": ["4"], "c": ["1"], "d": ["3"]}


def test_ring_of_two_equals_all() -> None:
    answers: Answers = {"a": [["1", "2", "2"]], "b": [["1", "1", "3"]]}
    assert compute_rewards("peer_label", answers, topology="ring") == compute_rewards("peer_label", answers)


@pytest.mark.parametrize(
    ("member", "topology", "order", "expected"),
    [
        ("b", "all", None, ["a", "c"]),
        ("a", "ring", None, ["c"]),
        ("b", "ring", ["c", "a", "b"], ["a"]),
    ],
)
def test_supervisors(member: str, topology: str, order: list[str] | None, expected: list[str]) -> None:
    assert supervisors(member, ["a", "b", "c"], topology, order) == expected  # type: ignore[arg-type]


# --- peer_pool ------------------------------------------------------------------------------


def test_peer_pool_counts_every_peer_sample_where_peer_label_ties() -> None:
    """Peers b (1,1,1) and c (2,2,3): their pseudo-labels tie (no peer_label), the pooled vote is 1."""
    answers: Answers = {"a": [["1", "2", None]], "b": [["1", "1", "1"]], "c": [["2", "2", "3"]]}
    assert compute_rewards("peer_label", answers).labels["a"] == [None]
    out = compute_rewards("peer_pool", answers)
    assert out.labels["a"] == ["1"] and out.rewards["a"] == [[1.0, 0.0, 0.0]]
    assert out.labels["b"] == ["2"]  # a and c pooled: 2 twice, 1 once, 3 once
    abstain = compute_rewards("peer_pool", answers, threshold=0.6)  # 1 holds 3 of 6 pooled samples
    assert abstain.labels["a"] == [None] and abstain.rewards["a"] == [[0.0, 0.0, 0.0]]


def test_surer_peers_take_a_label_only_where_the_peers_are_surer_than_the_member() -> None:
    """Prompt 0: a is sure of 7 (3 of 4), its peer b less sure of 5 (2 of 4): a takes no label, where
    plain peer_pool would teach it b's 5, and b, less sure than a, takes a's 7. Prompt 1: b (5, 3 of 4)
    is surer than a (2 of 4): a takes 5; a's own vote ties, so b has no label either way."""
    answers: Answers = {
        "a": [["7", "7", "7", "5"], ["5", "5", "6", "6"]],
        "b": [["5", "5", "7", None], ["5", "5", "5", "6"]],
    }
    plain = compute_rewards("peer_pool", answers)
    assert plain.labels == {"a": ["5", "5"], "b": ["7", None]}  # prompt 1: a's 5 and 6 tie
    surer = compute_rewards("peer_pool", answers, surer_peers=True)
    assert surer.labels == {"a": [None, "5"], "b": ["7", None]}
    assert surer.rewards["a"] == [[0.0] * 4, [1.0, 1.0, 0.0, 0.0]]
    assert surer.rewards["b"] == [[0.0, 0.0, 1.0, 0.0], [0.0] * 4]
    # Equal shares: no label (the peers must be surer, not as sure).
    tie: Answers = {"a": [["7", "7", "1", "2"]], "b": [["5", "5", "3", "4"]]}
    assert compute_rewards("peer_pool", tie, surer_peers=True).labels == {"a": [None], "b": [None]}
    # The member's own answers decide only where a label is taken: never what it is.
    rng = random.Random("surer")
    for _ in range(200):
        round_, names = _random_round(rng)
        out, base = compute_rewards("peer_pool", round_, surer_peers=True), compute_rewards("peer_pool", round_)
        for m in names:
            assert all(lab is None or lab == b for lab, b in zip(out.labels[m], base.labels[m], strict=True))


def test_the_config_s_surer_peers_reaches_a_graded_round() -> None:
    from corl.config import RewardConfig
    from corl.proto import GenerateResponse
    from corl.rewards import grade_round
    from corl.tasks import get_task

    def response(texts: list[str]) -> GenerateResponse:
        samples = [{"text": t, "token_ids": [1], "logprobs": [0.0], "finish_reason": "stop"} for t in texts]
        results = [{"prompt": "Calculate 3 + 4.", "prompt_token_ids": [1], "samples": samples}]
        return GenerateResponse.model_validate({"model": "m", "weight_version": 0, "results": results})

    responses = {"a": response(["7", "7", "7", "5"]), "b": response(["5", "5", "7", "x"])}
    weights, task = {"a": 1.0, "b": 1.0}, get_task("arith")
    assert grade_round(responses, task, RewardConfig(), weights).members["a"].labels == ["5"]
    surer = grade_round(responses, task, RewardConfig(surer_peers=True), weights)
    assert surer.members["a"].labels == [None] and surer.members["b"].labels == ["7"]


# --- peer_agreement -------------------------------------------------------------------------


def test_peer_agreement_unweighted() -> None:
    answers: Answers = {
        "a": [["1", "2", None]],
        "b": [["1", "1", "2", None]],  # peers may have a different G; invalid samples dilute
        "c": [["1", "3"]],
    }
    out = compute_rewards("peer_agreement", answers)
    # a's peers: 6 samples, '1' x3, '2' x1
    assert out.rewards["a"] == [[pytest.approx(3 / 6), pytest.approx(1 / 6), 0.0]]
    # c's peers: a (3) + b (4) = 7 samples; '1' x3, '3' x0
    assert out.rewards["c"] == [[pytest.approx(3 / 7), 0.0]]


def test_peer_agreement_reliability_weights() -> None:
    answers: Answers = {"a": [["1", "2"]], "b": [["1", "1"]], "c": [["2", "2"]]}
    out = compute_rewards("peer_agreement", answers, reliability={"b": 3.0, "c": 1.0})
    # a's peers: b weight 3 (2 samples '1'), c weight 1 (2 samples '2'): total weight 8
    assert out.rewards["a"] == [[pytest.approx(6 / 8), pytest.approx(2 / 8)]]
    muted = compute_rewards("peer_agreement", answers, reliability={"b": 0.0, "c": 1.0})
    assert muted.rewards["a"] == [[0.0, 1.0]]
    silent = compute_rewards("peer_agreement", answers, reliability={"a": 1.0, "b": 0.0, "c": 0.0})
    assert silent.rewards["a"] == [[0.0, 0.0]]  # no weighted peer: no signal


def test_peer_agreement_labels_are_the_peer_labels() -> None:
    answers: Answers = {"a": [["1", "2"]], "b": [["1", "1"]]}
    out = compute_rewards("peer_agreement", answers)
    assert out.labels == compute_rewards("peer_label", answers).labels


# --- baselines --------------------------------------------------------------------------------


def test_self_vote_uses_own_plurality() -> None:
    answers: Answers = {"a": [["1", "1", "2"], ["3", "4", None]], "b": [["2", "2", "2"], ["4", "4", "4"]]}
    out = compute_rewards("self_vote", answers)
    assert out.labels["a"] == ["1", None]
    assert out.rewards["a"] == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


def test_ground_truth() -> None:
    answers: Answers = {"a": [["1", "2", None], ["5", "5", "5"]], "b": [["1", "1", "1"], ["4", "4", "4"]]}
    out = compute_rewards("ground_truth", answers, dataset_answers=["1", None])
    assert out.rewards["a"] == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert out.labels["b"] == ["1", None]


def test_ground_truth_without_answers_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="dataset_answers"):
        compute_rewards("ground_truth", {"a": [["1"]], "b": [["1"]]})
    with pytest.raises(ValueError, match="1 entries for 2 prompts"):
        compute_rewards("ground_truth", {"a": [["1"], ["2"]]}, dataset_answers=["1"])


def test_none_mode_is_all_zero() -> None:
    answers: Answers = {"a": [["1", "1"], ["2"]], "b": [["1", "1"], ["2"]]}
    out = compute_rewards("none", answers)
    assert out.rewards == {"a": [[0.0, 0.0], [0.0]], "b": [[0.0, 0.0], [0.0]]}
    assert out.labels == {"a": [None, None], "b": [None, None]}


# --- members, errors ------------------------------------------------------------------------


def test_frozen_members_vote_but_get_no_rewards() -> None:
    answers: Answers = {"a": [["1", "2"]], "frozen": [["2", "2"]]}
    out = compute_rewards("peer_label", answers, members=["a"])
    assert set(out.rewards) == {"a"}
    assert out.rewards["a"] == [[0.0, 1.0]]
    assert set(out.pseudo_labels) == {"a", "frozen"}


def test_single_member_gets_no_peer_signal() -> None:
    out = compute_rewards("peer_label", {"a": [["1", "1"]]})
    assert out.rewards == {"a": [[0.0, 0.0]]}
    assert out.labels == {"a": [None]}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "peer_judge", "answers": {"a": [["1"]]}}, "judge_rewards"),
        ({"mode": "bogus", "answers": {"a": [["1"]]}}, "unknown vote reward mode"),
        ({"mode": "peer_label", "answers": {"a": [["1"]], "b": [["1"], ["2"]]}}, "same prompts"),
        ({"mode": "peer_label", "answers": {"a": [["1"]]}, "members": ["z"]}, "no answers"),
        (
            {"mode": "peer_label", "answers": {"a": [["1"]], "b": [["1"]]}, "topology": "ring", "order": ["a"]},
            "missing from the ring order",
        ),
    ],
)
def test_bad_input_is_a_value_error(kwargs: dict, match: str) -> None:
    mode = kwargs.pop("mode")
    answers = kwargs.pop("answers")
    with pytest.raises(ValueError, match=match):
        compute_rewards(mode, answers, **kwargs)


# --- invariants -------------------------------------------------------------------------------

ALPHABET: list[str | None] = ["1", "2", "3", "4", None]


def _random_round(rng: random.Random) -> tuple[dict[str, list[list[str | None]]], list[str]]:
    n = rng.randint(2, 5)
    names = [f"m{i}" for i in range(n)]
    n_prompts = rng.randint(1, 4)
    # Skewed answer distributions so that labels, ties and thresholds all occur.
    answers: dict[str, list[list[str | None]]] = {}
    for m in names:
        answers[m] = []
        for _ in range(n_prompts):
            g = rng.randint(1, 6)
            weights = [rng.random() ** 2 for _ in ALPHABET]
            answers[m].append(rng.choices(ALPHABET, weights=weights, k=g))
    return answers, names


def _reward_table(mode: str, answers: dict, member: str, **kw: Any) -> list[dict[str | None, float]]:
    """Per prompt, the reward that ``member`` would get for each possible answer.

    Computed by replacing the member's samples with one probe sample of every answer.
    """
    probe = {**answers, member: [list(ALPHABET) for _ in answers[member]]}
    rows = compute_rewards(mode, probe, **kw).rewards[member]
    return [dict(zip(ALPHABET, row, strict=True)) for row in rows]


def _random_votes(rng: random.Random, answers: dict) -> dict[str, list[list[str | None]]]:
    return {m: [rng.choices(ALPHABET, k=rng.randint(1, 6)) for _ in rows] for m, rows in answers.items()}


@pytest.mark.parametrize("mode", PEER_VOTE_MODES)
@pytest.mark.parametrize("topology", ["all", "ring"])
@pytest.mark.parametrize("with_votes", [False, True], ids=["samples-vote", "vote-samples"])
def test_invariant_rewards_never_depend_on_own_samples(mode: str, topology: str, with_votes: bool) -> None:
    """A member's rewards are a fixed function of each sample's answer, set by peers only: neither
    its own rewarded samples nor its own vote-only samples change them, its label or its weights."""
    rng = random.Random(f"{mode}-{topology}-{with_votes}")
    for _ in range(300):
        answers, names = _random_round(rng)
        kw: dict[str, Any] = {
            "topology": topology,
            "threshold": rng.choice([0.0, 0.4, 0.7]),
            "order": rng.sample(names, len(names)),
            "reliability": {m: rng.choice([0.0, 0.3, 1.0, 2.5]) for m in names},
        }
        if len(names) >= 3 and rng.random() < 0.5:  # a teacher votes for one member
            kw["teachers"] = {names[-1]: rng.choice(names[:-1])}
        votes = _random_votes(rng, answers) if with_votes else None
        member = rng.choice(names)
        table = _reward_table(mode, answers, member, votes=votes, **kw)
        original = compute_rewards(mode, answers, votes=votes, **kw)
        perturbed_answers = {
            **answers,
            member: [rng.choices(ALPHABET, k=rng.randint(1, 6)) for _ in answers[member]],
        }
        perturbed_votes = {**votes, member: _random_votes(rng, answers)[member]} if votes is not None else None
        perturbed = compute_rewards(mode, perturbed_answers, votes=perturbed_votes, **kw)
        for out, own in ((original, answers[member]), (perturbed, perturbed_answers[member])):
            expected = [[table[p][a] for a in samples] for p, samples in enumerate(own)]
            assert out.rewards[member] == expected
        assert perturbed.labels[member] == original.labels[member]
        own_weights = (original.weights or {}).get(member), (perturbed.weights or {}).get(member)
        assert own_weights[0] == own_weights[1]


@pytest.mark.parametrize(
    ("member", "topology", "expected"),
    [
        ("a", "all", ["b", "c", "a0"]),  # its teacher beside its peers
        ("b", "all", ["a", "c"]),  # a's teacher supervises no one else
        ("a", "ring", ["c", "a0"]),
        ("b", "ring", ["a"]),  # the teacher is not in the ring
    ],
)
def test_a_teacher_votes_for_its_student_only(member: str, topology: str, expected: list[str]) -> None:
    present = ["a", "b", "c", "a0"]
    assert supervisors(member, present, topology, ["a", "b", "c", "a0"], {"a0": "a"}) == expected  # type: ignore[arg-type]


def test_a_teacher_never_supervises_alone() -> None:
    assert supervisors("a", ["a", "a0"], "all", None, {"a0": "a"}) == []
    answers: Answers = {"a": [["1", "2"]], "a0": [["1", "1"]]}
    out = compute_rewards("peer_pool", answers, members=["a"], teachers={"a0": "a"})
    assert out.rewards["a"] == [[0.0, 0.0]] and out.labels["a"] == [None]


def test_vote_samples_replace_the_rewarded_samples_as_ballots() -> None:
    """With vote-only samples, peers' labels come from them, not from the peers' rewarded samples."""
    answers: Answers = {"a": [["1", "2"]], "b": [["2", "2"]], "c": [["2", "2"]]}
    votes: Answers = {"a": [["9"]], "b": [["1"]], "c": [["1"]]}
    for mode in ("peer_label", "peer_pool", "peer_weighted", "peer_soft"):
        assert compute_rewards(mode, answers).rewards["a"] == [[0.0, 1.0]], mode
        out = compute_rewards(mode, answers, votes=votes)
        assert out.rewards["a"] == [[1.0, 0.0]], mode
        assert out.pseudo_labels == {"a": ["9"], "b": ["1"], "c": ["1"]}, mode
    with pytest.raises(ValueError, match="same prompts"):
        compute_rewards("peer_pool", answers, votes={**votes, "b": [["1"], ["1"]]})


def test_peer_soft_rewards_are_shares_over_the_top_share_and_prompts_weigh_by_consistency() -> None:
    # a's peers pooled: prompt 0 {1: 3, 2: 1} of 4; prompt 1 {1: 1, 2: 1, None: 2} of 4.
    answers: Answers = {
        "a": [["1", "2", "3", None], ["1", "2", "3", "3"]],
        "b": [["1", "1"], ["1", None]],
        "c": [["1", "2"], ["2", None]],
    }
    out = compute_rewards("peer_soft", answers)
    assert out.rewards["a"] == [[1.0, 1 / 3, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    assert out.weights is not None and out.weights["a"] == [0.75, 0.25]
    assert out.labels["a"] == ["1", None]  # the pooled plurality; tied on prompt 1
    assert compute_rewards("peer_soft", answers, threshold=0.5).weights["a"] == [0.75, 0.0]  # type: ignore[index]


@pytest.mark.parametrize("mode", PEER_VOTE_MODES)
def test_invariant_dataset_answers_never_reach_peer_rewards(mode: str) -> None:
    rng = random.Random(mode)
    for _ in range(200):
        answers, names = _random_round(rng)
        n_prompts = len(answers[names[0]])
        truth = [rng.choice(ALPHABET) for _ in range(n_prompts)]
        poisoned = [rng.choice(["1", "2", "999", None]) for _ in range(n_prompts)]
        baseline = compute_rewards(mode, answers)
        assert compute_rewards(mode, answers, dataset_answers=truth) == baseline
        assert compute_rewards(mode, answers, dataset_answers=poisoned) == baseline
        assert compute_rewards(mode, answers, dataset_answers=[]) == baseline  # not even validated


def test_invariant_dataset_answers_do_reach_ground_truth() -> None:
    """Guard for the test above: the poisoning would have been seen by a mode that reads them."""
    answers: Answers = {"a": [["1", "2"]], "b": [["1", "1"]]}
    assert compute_rewards("ground_truth", answers, dataset_answers=["1"]) != compute_rewards(
        "ground_truth", answers, dataset_answers=["2"]
    )


@pytest.mark.parametrize("mode", [m for m, spec in REWARD_MODES.items() if not spec.judged])
def test_rewards_have_the_samples_shape_and_lie_in_unit_interval(mode: str) -> None:
    rng = random.Random(f"shape-{mode}")
    for _ in range(100):
        answers, names = _random_round(rng)
        truth = [rng.choice(ALPHABET) for _ in answers[names[0]]]
        formatted = {m: [[a is not None for a in s] for s in answers[m]] for m in names}
        out = compute_rewards(
            mode,
            answers,
            dataset_answers=truth,
            threshold=rng.choice([0.0, 0.5]),
            formatted=formatted,
            seed=rng.randrange(99),
        )
        for m in names:
            assert [len(r) for r in out.rewards[m]] == [len(s) for s in answers[m]]
            assert len(out.labels[m]) == len(answers[m])
            for row, samples in zip(out.rewards[m], answers[m], strict=True):
                for r, a in zip(row, samples, strict=True):
                    assert 0.0 <= r <= 1.0
                    if a is None and mode != "random":  # the random control pays blind, by design
                        assert r == 0.0


def test_peer_weighted_lets_a_reliable_confident_peer_carry_the_vote_and_needs_unsure_peers_to_agree() -> None:
    # a is supervised by b (reliable, sure of "1") and c (unreliable, sure of "2"): b's answer wins,
    # where peer_pool, one vote per sample, has a tie.
    answers: Answers = {"a": [["1", "2"]], "b": [["1"] * 4], "c": [["2"] * 4]}
    weights = {"a": 1.0, "b": 1.0, "c": 0.25}
    assert compute_rewards("peer_pool", answers).labels["a"] == [None]
    out = compute_rewards("peer_weighted", answers, reliability=weights)
    assert out.labels["a"] == ["1"] and out.rewards["a"] == [[1.0, 0.0]]
    # Confidence: one vote per sample, c's six "2"s beat b's four "1"s; weighted, b's certainty
    # (4 of 4: 1.0) beats c's 6 of 8 (0.75 squared: 0.56).
    unsure = {"a": [["1"]], "b": [["1"] * 4], "c": [["2"] * 6 + ["3", "4"]]}
    assert compute_rewards("peer_pool", unsure).labels["a"] == ["2"]
    assert compute_rewards("peer_weighted", unsure).labels["a"] == ["1"]
    # Two unsure peers (half their samples on one answer: 0.25 each of a mass of 2) label a prompt
    # at threshold 0.2 only when they agree: a tie, agreement (0.5 / 2), one alone (0.25 / 2).
    half = ["x", "y"]
    split: Answers = {
        "a": [["1"], ["1"], ["1"]],
        "b": [["1", "1", *half], ["1", "1", *half], ["1", "1", *half]],
        "c": [["2", "2", "u", "v"], ["1", "1", "u", "v"], ["3", "u", "v", "w"]],
    }
    assert compute_rewards("peer_weighted", split, threshold=0.2).labels["a"] == [None, "1", None]
    assert compute_rewards("peer_weighted", split).labels["a"] == [None, "1", "1"]


def test_vote_samples_config_is_checked() -> None:
    from corl.config import ConfigError, parse_config

    members = [{"name": n, "model": "m", "servers": [f"http://{n}"]} for n in "ab"]
    with pytest.raises(ConfigError, match="greedy samples are identical"):
        parse_config({"members": members, "reward": {"votes": {"samples": 4, "temperature": 0.0}}})
    cfg = parse_config({"members": members, "reward": {"votes": {"samples": 4, "temperature": 0.5}}})
    assert (cfg.reward.votes.samples, cfg.reward.votes.temperature) == (4, 0.5)
    for mode in ("peer_judge", "ground_truth", "none"):  # modes that never read a vote draw none
        reward = {"mode": mode, "votes": {"samples": 1}}
        assert parse_config({"members": members, "reward": reward}).reward.vote_samples() == 0
    assert cfg.reward.vote_samples() == 4
    assert [m for m, spec in REWARD_MODES.items() if spec.votes] == [*PEER_VOTE_MODES, "self_vote"]


def test_teachers_are_frozen_and_teach_a_trained_member() -> None:
    from corl.config import ConfigError, parse_config

    def members(**teacher: object) -> list[dict]:
        base = [{"name": n, "model": "m", "servers": [f"http://{n}"]} for n in "ab"]
        return [*base, {"name": "t", "model": "m", "servers": ["http://t"], "role": "frozen", **teacher}]

    assert parse_config({"members": members(teacher_of="a")}).teachers() == {"t": "a"}
    with pytest.raises(ConfigError, match="teacher_of must name a trained member"):
        parse_config({"members": members(teacher_of="zz")})
    with pytest.raises(ConfigError, match="teachers are frozen members"):
        parse_config({"members": members(teacher_of="a", role="trained")})
    with pytest.raises(ConfigError, match="reward mode peer_judge reads no votes"):
        parse_config({"members": members(teacher_of="a"), "reward": {"mode": "peer_judge"}})


@pytest.mark.parametrize("mode", PEER_VOTE_MODES)
def test_invariants_hold_with_an_outside_endpoint_voting(mode: str) -> None:
    """An endpoint member votes as a frozen peer (rewarded: never), often with no-answer samples (None:
    a missing choice, no content): a rewarded member's reward is still a fixed function of each of its
    answers, set by its peers, and dataset answers still never reach it."""
    rng = random.Random(f"endpoint-{mode}")
    for _ in range(200):
        answers, names = _random_round(rng)
        g = [len(s) for s in answers[names[0]]]
        answers["ops"] = [[a if rng.random() > 0.3 else None for a in rng.choices(ALPHABET, k=k)] for k in g]
        kw: dict[str, Any] = {"members": names, "threshold": rng.choice([0.0, 0.4]), "order": [*names, "ops"]}
        member = rng.choice(names)
        table = _reward_table(mode, answers, member, **kw)
        original = compute_rewards(mode, answers, **kw)
        assert set(original.rewards) == set(names)  # the endpoint is never rewarded
        perturbed_answers = {**answers, member: [rng.choices(ALPHABET, k=len(s)) for s in answers[member]]}
        perturbed = compute_rewards(mode, perturbed_answers, **kw)
        for out, own in ((original, answers[member]), (perturbed, perturbed_answers[member])):
            assert out.rewards[member] == [[table[p][a] for a in samples] for p, samples in enumerate(own)]
        truth = [rng.choice(ALPHABET) for _ in g]
        assert compute_rewards(mode, answers, dataset_answers=truth, **kw) == original
    # Guard: the endpoint's votes do move its peers' rewards (it is not ignored).
    voted = {"a": [["1", "2"]], "b": [["2", "3"]], "ops": [["1", "1"]]}
    alone = {"a": [["1", "2"]], "b": [["2", "3"]]}
    assert compute_rewards("peer_pool", voted, members=["a", "b"]) != compute_rewards("peer_pool", alone)
