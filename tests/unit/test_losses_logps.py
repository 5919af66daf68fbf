"""The trainer's log-probs of a sampled batch reproduce the sampler's: packing, padding, position
ids and temperature are right, so an on-policy batch has importance ratio 1 (per model family)."""

from __future__ import annotations

import pytest
import torch

from corl.cohort.presets import MemberSpec
from corl.models.sampling import sample
from corl.models.tokenizer import build_char_tokenizer
from corl.proto import SamplingSettings
from corl.trainer.collate import pack
from corl.trainer.losses import response_logps
from corl.trainer.testing import batch_from_samples

_ONE_HEAD_ONE_LAYER = dict(num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1)
_DECODER = dict(hidden_size=32, intermediate_size=64, **_ONE_HEAD_ONE_LAYER)  # llama, qwen2
FAMILIES = {
    "gpt2": dict(n_embd=32, n_layer=1, n_head=1),
    "llama": _DECODER,
    "qwen2": _DECODER,
    "mamba": dict(hidden_size=32, num_hidden_layers=1, state_size=8, expand=2),
}


def _model(family: str, tok, initializer_range: float = 0.02):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    arch = {**FAMILIES[family], "initializer_range": initializer_range}
    cfg = MemberSpec(family, family, arch).build_config(tok, max_positions=64)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _max_diff(model, tok, temperature: float, top_p: float, trainer_top_p: float | None = None) -> float:  # type: ignore[no-untyped-def]
    # Prompts of different lengths so left padding is exercised; samples stop at different lengths.
    prompts = ["1+2=", "12+34=", "7+80="]
    results = sample(model, tok, prompts, n=3, max_tokens=6, temperature=temperature, top_p=top_p, seed=1)
    sampling = SamplingSettings(temperature=temperature, top_p=top_p, max_tokens=6)
    batch = pack(batch_from_samples(results, prompts, sampling=sampling).samples(), tok.pad_token_id)
    with torch.no_grad():
        logps, ent = response_logps(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.response_len,
            temperature=temperature,
            top_p=top_p if trainer_top_p is None else trainer_top_p,
        )
    assert ent is not None and ent.shape == logps.shape and torch.isfinite(ent).all()
    return float(((logps - batch.old_logps) * batch.response_mask).abs().max())


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_on_policy_batch_has_ratio_one(family: str, temperature: float) -> None:
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    diff = _max_diff(_model(family, tok), tok, temperature, 1.0)
    assert diff < 1e-4, f"{family}: trainer log-probs differ from sampling log-probs by {diff}"


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_top_p_log_probs_match_the_sampler(family: str) -> None:
    """With top_p < 1 the sampler's log-probs are over the nucleus; the trainer truncates the same
    way (and without the truncation the two would differ: the guard below)."""
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    model = _model(family, tok, initializer_range=0.5)  # peaked distributions: a clear nucleus
    diff = _max_diff(model, tok, 0.8, 0.7)
    assert diff < 1e-4, f"{family}: top-p trainer log-probs differ from sampling log-probs by {diff}"
    assert _max_diff(model, tok, 0.8, 0.7, trainer_top_p=1.0) > 1e-2
