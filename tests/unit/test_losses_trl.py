"""Cross-check: our loss equals the installed TRL ``GRPOTrainer._compute_loss`` on the same tensors.

TRL's method is called unbound on a stub holding just the attributes it reads (one process, no
gradient accumulation), with the per-token log-probs injected, so the comparison covers exactly the
ratio, clipping, KL and aggregation code of each ``loss_type``.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from corl.trainer.losses import policy_loss


def _grpo_trainer() -> type:
    from trl import GRPOTrainer

    return GRPOTrainer


class _Accelerator:
    num_processes = 1

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    gather_for_metrics = gather

    def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x


def _trl_loss(
    loss_type: str,
    logps: torch.Tensor,
    inputs: dict,
    *,
    eps_low: float,
    eps_high: float,
    beta: float,
    max_completion_length: int,
) -> tuple[torch.Tensor, dict]:
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=max_completion_length,
        accelerator=_Accelerator(),
        _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
    )
    loss = _grpo_trainer()._compute_loss(stub, None, inputs)  # type: ignore[arg-type]
    return loss, stub._metrics["train"]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_matches_trl_compute_loss(loss_type: str, beta: float) -> None:
    g = torch.Generator().manual_seed(0)
    b, p, t = 6, 3, 5
    old = -torch.rand(b, t, generator=g) * 3
    logps = old + torch.randn(b, t, generator=g) * 0.3  # ratios spread across both clip bounds
    ref = old + torch.randn(b, t, generator=g) * 0.1
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    adv = torch.randn(b, generator=g)
    inputs = {
        "prompt_ids": torch.zeros(b, p, dtype=torch.long),
        "prompt_mask": torch.ones(b, p, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    trl_logps = logps.clone().requires_grad_(True)
    ours_logps = logps.clone().requires_grad_(True)
    expected, metrics = _trl_loss(
        loss_type, trl_logps, inputs, eps_low=0.2, eps_high=0.28, beta=beta, max_completion_length=8
    )
    ours = policy_loss(
        ours_logps,
        old,
        adv,
        mask,
        loss_type=loss_type,
        epsilon_low=0.2,  # type: ignore[arg-type]
        epsilon_high=0.28,
        beta=beta,
        ref_logps=ref if beta else None,
        max_completion_length=8,
    )
    assert ours.loss.item() == pytest.approx(expected.item(), rel=1e-6, abs=1e-7)
    expected.backward()
    ours.loss.backward()
    torch.testing.assert_close(ours_logps.grad, trl_logps.grad)
    assert ours.clip_fraction == pytest.approx(metrics["clip_ratio/region_mean"][0], abs=1e-6)
    assert 0 < ours.clip_fraction < 1
    if beta:
        assert ours.ref_kl == pytest.approx(metrics["kl"][0], abs=1e-6)
