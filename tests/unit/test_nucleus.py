"""The nucleus mask without a full sort: transformers' TopPLogitsWarper's rule, exactly."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopPLogitsWarper

from corl.models.nucleus import outside_nucleus


def hf_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    flat = logits.reshape(-1, logits.size(-1))
    return torch.isinf(TopPLogitsWarper(top_p)(None, flat.clone())).reshape(logits.shape)  # type: ignore[arg-type]


@pytest.mark.parametrize("top_p", [0.1, 0.7, 0.95, 0.999])
@pytest.mark.parametrize("scale", [0.05, 1.0, 8.0])  # near-flat (the top-k must grow to the vocabulary) to peaked
def test_same_tokens_as_the_sorting_warper(top_p: float, scale: float) -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 3000) * scale  # (B, T, V) as the trainer passes it
    assert torch.equal(outside_nucleus(logits, top_p), hf_mask(logits, top_p))


def exact_mask(logits: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule in float64 with a full sort (drop a token when the more probable ones hold top_p),
    and where float32 may decide otherwise (the mass before the token within 1e-4 of top_p)."""
    probs, order = logits.double().softmax(-1).sort(-1, descending=True)
    before = probs.cumsum(-1) - probs
    drop = before >= top_p
    drop[..., 0] = False
    close = (before - top_p).abs() < 1e-4
    return drop.scatter(-1, order, drop), close.scatter(-1, order, close)


def test_the_most_probable_token_is_always_kept() -> None:
    logits = torch.tensor([[10.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = outside_nucleus(logits, 0.5)
    assert mask[0].tolist() == [False, True, True, True]
    assert (~mask[1]).sum() == 2  # two of four equal tokens hold half the mass (which two is a tie)
    assert (~outside_nucleus(logits, 1e-6)).sum(-1).tolist() == [1, 1]


@pytest.mark.parametrize("peak", [15.0, 9.0])  # covered by the first top-64; or not, where k must grow
def test_a_large_vocabulary(peak: float) -> None:
    """Gemma's 262k-token vocabulary: the float64 rule's tokens. (Float32 may decide a token whose
    preceding mass is within 1e-4 of top_p either way; the sampler and the trainer share this function.)"""
    torch.manual_seed(1)
    logits = torch.randn(16, 262_144)
    logits[:, :20] += peak
    mask = outside_nucleus(logits, 0.95)
    exact, close = exact_mask(logits, 0.95)
    assert torch.equal(mask[~close], exact[~close])
    assert ((~mask).sum(-1) > 20).any() == (peak < 10)
