"""Group-relative advantages (GRPO): each sample's reward against the other samples of its prompt.

Pure torch, no I/O. Matches TRL's ``scale_rewards="group"`` / ``"none"``: the baseline is the group
mean, the scale the group's Bessel-corrected std (``nanstd``) plus 1e-4. A group whose rewards are
all equal carries no signal: its samples are masked out (and counted) instead of training on zeros.
A group's weight (``PromptGroup.weight``, a reward mode's confidence in the prompt) scales its
advantages after normalisation; weight 0 masks it out like a group without signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from trl.trainer.utils import nanstd

STD_EPS = 1e-4


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: torch.Tensor  # (B,), 0.0 for samples of skipped groups
    keep: torch.Tensor  # (B,) bool: the sample belongs to a group with signal
    groups: int
    skipped_groups: int


def group_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[str],
    *,
    scale_rewards: bool = True,
    weights: torch.Tensor | None = None,
) -> GroupAdvantages:
    """Advantages of ``rewards`` (B,) within the groups named by ``group_ids`` (any order, any sizes);
    ``weights`` (B,): each row's group weight (default 1)."""
    if rewards.dim() != 1 or rewards.numel() != len(group_ids):
        raise ValueError(f"rewards {tuple(rewards.shape)} do not match {len(group_ids)} group ids")
    index: dict[str, int] = {}
    gidx = torch.tensor([index.setdefault(g, len(index)) for g in group_ids], dtype=torch.long)
    pos = torch.zeros_like(gidx)
    seen: dict[int, int] = {}
    for i, g in enumerate(gidx.tolist()):
        pos[i] = seen[g] = seen.get(g, -1) + 1
    # A (groups, max size) grid padded with NaN, so TRL's nan-aware reductions give per-group stats.
    grid = torch.full((len(index), int(pos.max()) + 1), float("nan"), dtype=torch.float64)
    grid[gidx, pos] = rewards.to(torch.float64)
    mean = torch.nanmean(grid, dim=1)
    std = nanstd(grid, dim=1)  # NaN for one-sample groups: no signal either
    signal = ~(torch.isnan(std) | torch.isclose(std, torch.zeros_like(std)))
    adv = rewards.to(torch.float64) - mean[gidx]
    if scale_rewards:
        adv = adv / (std[gidx] + STD_EPS)
    if weights is not None:
        adv = adv * weights.to(torch.float64)
        signal[gidx[weights == 0]] = False
    keep = signal[gidx]
    adv = torch.where(keep, adv, torch.zeros_like(adv)).to(rewards.dtype)
    return GroupAdvantages(adv, keep, len(index), int((~signal).sum()))
