"""The control rewards: label-free, peer-free baselines. Their invariants: ``random`` reads nothing
(neither answers, nor labels, nor correctness); ``format`` reads only each sample's form."""

from __future__ import annotations

import random

import pytest

from corl.config import RewardConfig
from corl.proto import GenerateResponse
from corl.rewards import REWARD_MODES, compute_rewards, grade_round
from corl.tasks import get_task


def _round(rng: random.Random, members: tuple[str, ...] = ("a", "b", "c"), prompts: int = 4, g: int = 8):
    return {m: [[rng.choice(["1", "2", "3", None]) for _ in range(g)] for _ in range(prompts)] for m in members}


def test_controls_are_label_free_and_not_peer_modes() -> None:
    for name in ("random", "format"):
        spec = REWARD_MODES[name]
        assert spec.control and spec.label_free and not spec.peer and not spec.votes


def test_random_is_independent_of_answers_labels_and_correctness() -> None:
    rng = random.Random(0)
    answers, others = _round(rng), _round(rng)
    truth, poisoned = ["1"] * 4, ["2"] * 4
    base = compute_rewards("random", answers, seed=7)
    assert compute_rewards("random", others, seed=7).rewards == base.rewards  # other answers, same draws
    assert compute_rewards("random", answers, seed=7, dataset_answers=truth).rewards == base.rewards
    assert compute_rewards("random", answers, seed=7, dataset_answers=poisoned).rewards == base.rewards
    assert compute_rewards("random", answers, seed=8).rewards != base.rewards  # a new round, new draws
    assert all(label is None for labels in base.labels.values() for label in labels)


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5, 1.0])
def test_random_pays_with_probability_p(p: float) -> None:
    answers = _round(random.Random(1), prompts=50, g=16)
    flat = [r for m in answers for row in compute_rewards("random", answers, seed=3, p=p).rewards[m] for r in row]
    assert abs(sum(flat) / len(flat) - p) < 0.05  # 2,400 draws: the standard error is ~0.01


def test_format_pays_the_asked_form_and_reads_no_answer() -> None:
    rng = random.Random(2)
    answers = _round(rng)
    formatted = {m: [[rng.random() < 0.5 for _ in row] for row in answers[m]] for m in answers}
    out = compute_rewards("format", answers, formatted=formatted, dataset_answers=["1"] * 4)
    assert out.rewards == {m: [[float(f) for f in row] for row in formatted[m]] for m in answers}
    assert compute_rewards("format", _round(rng), formatted=formatted).rewards == out.rewards
    with pytest.raises(ValueError, match="formatted"):
        compute_rewards("format", answers)


def test_grade_round_reads_the_form_with_the_task_and_seeds_random_per_round() -> None:
    def response(texts: list[str]) -> GenerateResponse:
        samples = [{"text": t, "token_ids": [1], "logprobs": [0.0], "finish_reason": "stop"} for t in texts]
        results = [{"prompt": "Calculate 2 + 2.", "prompt_token_ids": [1], "samples": samples}]
        return GenerateResponse.model_validate({"model": "m", "weight_version": 0, "results": results})

    responses = {"a": response(["4", "The answer is 4.", "2 + 2"]), "b": response(["5", "4", "four"])}
    task = get_task("arith")
    out = grade_round(responses, task, RewardConfig(mode="format"), {"a": 1.0, "b": 1.0})
    assert out.members["a"].rewards == [[1.0, 0.0, 0.0]]
    assert out.members["b"].rewards == [[1.0, 1.0, 0.0]]  # "5" is wrong and still in form: no label read
    cfg = RewardConfig(mode="random", p=0.5)
    draws = [grade_round(responses, task, cfg, {"a": 1.0, "b": 1.0}, seed=s).members["a"].rewards for s in range(8)]
    assert len({str(d) for d in draws}) > 1
    assert grade_round(responses, task, cfg, {"a": 1.0, "b": 1.0}, seed=3).members["a"].rewards == draws[3]
