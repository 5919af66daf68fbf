import math

import pytest
import torch

from corl.trainer.advantages import group_advantages


def test_group_relative_with_std_scaling_skips_flat_and_singleton_groups() -> None:
    # group a: rewards 1,0,0,1 (interleaved with b); b all equal; c a single sample.
    group_ids = ["a", "b", "a", "b", "a", "b", "a", "b", "c"]
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    out = group_advantages(rewards, group_ids, scale_rewards=True)
    # mean 0.5, Bessel std sqrt(4 * 0.25 / 3) = 0.57735..., advantage 0.5 / (std + 1e-4)
    a = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-4)
    expected = [a, 0, -a, 0, -a, 0, a, 0, 0]
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-6)
    assert out.keep.tolist() == [True, False, True, False, True, False, True, False, False]
    assert (out.groups, out.skipped_groups) == (3, 2)


def test_group_relative_without_scaling_is_reward_minus_group_mean() -> None:
    out = group_advantages(
        torch.tensor([3.0, 1.0, 0.0, 0.0, 0.0, 3.0]), ["x", "x", "y", "y", "y", "y"], scale_rewards=False
    )
    # x: mean 2 -> +1, -1; y: mean 0.75 -> -0.75 x3, 2.25
    assert out.advantages.tolist() == pytest.approx([1.0, -1.0, -0.75, -0.75, -0.75, 2.25])
    assert out.skipped_groups == 0


def test_all_flat_batch_has_no_signal() -> None:
    out = group_advantages(torch.ones(4), ["g", "g", "h", "h"])
    assert not out.keep.any() and out.skipped_groups == 2 and out.advantages.abs().sum() == 0


def test_group_weights_scale_advantages_and_weight_zero_masks_the_group() -> None:
    rewards = torch.tensor([3.0, 1.0, 3.0, 1.0, 3.0, 1.0])
    ids = ["x", "x", "y", "y", "z", "z"]
    weights = torch.tensor([1.0, 1.0, 0.25, 0.25, 0.0, 0.0])
    out = group_advantages(rewards, ids, scale_rewards=False, weights=weights)
    assert out.advantages.tolist() == pytest.approx([1.0, -1.0, 0.25, -0.25, 0.0, 0.0])
    assert out.keep.tolist() == [True, True, True, True, False, False]
    assert out.skipped_groups == 1
