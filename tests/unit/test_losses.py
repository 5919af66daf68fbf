"""Every loss variant against numbers worked out by hand on one tiny batch.

Batch: 2 sequences, 2 response tokens, the second sequence has 1 real token.
  seq 0: A = +1, ratios (1.5, 0.5); seq 1: A = -1, ratio 0.5 (its padded token has ratio 2, masked).
With eps = 0.2 the per-token surrogate -min(r A, clip(r) A) is:
  seq 0 tok 0: -min(1.5, 1.2) = -1.2 (clipped)   seq 0 tok 1: -min(0.5, 0.8) = -0.5
  seq 1 tok 0: -min(-0.5, -0.8) = 0.8 (clipped)
"""

import math

import pytest
import torch

from corl.trainer.losses import policy_loss

MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
ADV = torch.tensor([1.0, -1.0])
OLD = torch.tensor([[-1.0, -2.0], [-1.5, -0.7]])
RATIOS = torch.tensor([[1.5, 0.5], [0.5, 2.0]])


def _logps() -> torch.Tensor:
    return (OLD + RATIOS.log()).clone().requires_grad_(True)


@pytest.mark.parametrize(
    ("loss_type", "kwargs", "expected"),
    [
        ("grpo", {}, ((-1.2 - 0.5) / 2 + 0.8) / 2),  # -0.025
        ("dr_grpo", {"max_completion_length": 4}, (-1.2 - 0.5 + 0.8) / (2 * 4)),  # -0.1125
        ("dr_grpo", {}, (-1.2 - 0.5 + 0.8) / (2 * 2)),  # defaults to the padded length
        ("bnpo", {}, (-1.2 - 0.5 + 0.8) / 3),  # -0.3
        ("dapo", {}, (-1.2 - 0.5 + 0.8) / 3),
        ("dapo", {"num_items_in_batch": 6}, (-1.2 - 0.5 + 0.8) / 6),  # whole-batch token count
        ("grpo", {"epsilon_high": 0.6}, ((-1.5 - 0.5) / 2 + 0.8) / 2),  # clip-higher: 1.5 inside 1.6
    ],
)
def test_loss_variants_match_hand_computed(loss_type: str, kwargs: dict, expected: float) -> None:
    out = policy_loss(_logps(), OLD, ADV, MASK, loss_type=loss_type, epsilon_low=0.2, **kwargs)  # type: ignore[arg-type]
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)


def test_clipped_tokens_get_no_gradient_and_clip_fraction_counts_them() -> None:
    logps = _logps()
    out = policy_loss(logps, OLD, ADV, MASK, loss_type="grpo", epsilon_low=0.2)
    out.loss.backward()
    assert logps.grad is not None
    # only seq 0 tok 1 is unclipped: d(-r A)/dlogp = -r A = -0.5, times 1/2 (token mean) and 1/2 (seq mean)
    assert logps.grad.flatten().tolist() == pytest.approx([0.0, -0.125, 0.0, 0.0])
    assert out.clip_fraction == pytest.approx(2 / 3)
    # k3 of the sampling policy vs current: mean of r - 1 - log r over the 3 real tokens
    k3 = [(r - 1 - math.log(r)) for r in (1.5, 0.5, 0.5)]
    assert out.approx_kl == pytest.approx(sum(k3) / 3, abs=1e-6)


def test_kl_to_reference_adds_beta_times_k3() -> None:
    logps = _logps()
    ref = logps.detach() + math.log(2.0)  # k3 = exp(ln 2) - ln 2 - 1 on every token
    k3 = 1 - math.log(2.0)
    out = policy_loss(logps, OLD, ADV, MASK, loss_type="grpo", epsilon_low=0.2, beta=0.1, ref_logps=ref)
    assert out.loss.item() == pytest.approx(-0.025 + 0.1 * k3, abs=1e-6)
    assert out.ref_kl == pytest.approx(k3, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logps"):
        policy_loss(logps, OLD, ADV, MASK, beta=0.1)


def test_on_policy_ratio_one_gives_plain_policy_gradient() -> None:
    logps = OLD.clone().requires_grad_(True)
    out = policy_loss(logps, OLD, ADV, MASK, loss_type="bnpo")
    out.loss.backward()
    assert out.loss.item() == pytest.approx((-1 - 1 + 1) / 3)
    assert logps.grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, 1 / 3, 0.0])  # type: ignore[union-attr]
    assert out.clip_fraction == 0.0 and out.approx_kl == pytest.approx(0.0)
