"""The trainer's log-probs of a sampled batch reproduce the sampler's: packing, padding, position
ids and temperature are right, so an on-policy batch has importance ratio 1 (per model family)."""

from __future__ import annotations

import pytest
import torch

from corl.models.sampling import sample
from corl.models.tokenizer import build_char_tokenizer
from corl.proto import SamplingSettings
from corl.trainer.collate import pack
from corl.trainer.losses import response_logps
from corl.trainer.testing import batch_from_samples

FAMILIES = {
    "gpt2": dict(n_embd=32, n_layer=1, n_head=1, n_positions=64),
    "llama": dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
    ),
    "qwen2": dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
    ),
    "mamba": dict(hidden_size=32, num_hidden_layers=1, state_size=8, expand=2),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_on_policy_batch_has_ratio_one(family: str, temperature: float) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    cfg = AutoConfig.for_model(
        family,
        vocab_size=len(tok),
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **FAMILIES[family],
    )
    model = AutoModelForCausalLM.from_config(cfg).eval()
    # Prompts of different lengths so left padding is exercised; samples stop at different lengths.
    prompts = ["1+2=", "12+34=", "7+80="]
    results = sample(model, tok, prompts, n=3, max_tokens=6, temperature=temperature, seed=1)
    graded = batch_from_samples(results, prompts, sampling=SamplingSettings(temperature=temperature, max_tokens=6))
    batch = pack(graded.samples(), tok.pad_token_id)
    with torch.no_grad():
        logps, ent = response_logps(
            model, batch.input_ids, batch.attention_mask, batch.response_len, temperature=temperature
        )
    diff = ((logps - batch.old_logps) * batch.response_mask).abs().max().item()
    assert diff < 1e-4, f"{family}: trainer log-probs differ from sampling log-probs by {diff}"
    assert ent is not None and ent.shape == logps.shape
