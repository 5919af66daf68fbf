"""Control rewards: label-free, peer-free baselines that every peer mode must beat.

A gain under a peer mode counts only above what these give. ``random`` pays each sample at random
(Bernoulli(``p``), seeded per round): a policy-gradient update on it moves a model by noise and by
the loss's own biases alone. ``format`` pays a sample for being in the form the task asks for (the
number alone, a ``#### x`` line): what learning the form is worth without learning the answers. Neither
reads a label, an answer's value or another member's samples.
"""

from __future__ import annotations

import random

from .inputs import RewardInputs, RewardOutcome


def _unlabelled(inp: RewardInputs, rewards: dict[str, list[list[float]]]) -> RewardOutcome:
    n = inp.n_prompts
    return RewardOutcome(rewards=rewards, labels={m: [None] * n for m in inp.members}, pseudo_labels=inp.pseudo())


def random_rewards(inp: RewardInputs) -> RewardOutcome:
    """Each sample's reward is 1 with probability ``inp.p``, else 0; the draws depend only on the round's
    seed and the member's name (a retried round pays the same)."""
    rewards = {}
    for m in inp.members:
        rng = random.Random(f"{inp.seed}:{m}")
        rewards[m] = [[1.0 if rng.random() < inp.p else 0.0 for _ in samples] for samples in inp.answers[m]]
    return _unlabelled(inp, rewards)


def format_rewards(inp: RewardInputs) -> RewardOutcome:
    """1 when the sample is in the form the task asks for (``Task.is_formatted``), else 0."""
    if inp.formatted is None:
        raise ValueError("the format control needs each sample's formatted flag (RewardInputs.formatted)")
    rewards = {m: [[1.0 if f else 0.0 for f in row] for row in inp.formatted[m]] for m in inp.members}
    return _unlabelled(inp, rewards)
