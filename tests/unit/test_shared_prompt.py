"""Rows that share a prompt share its forward pass in the trainer (``trainer.losses``): log-probs,
entropies and gradients are those of one forward over every row, for every attention family
(a sliding window shorter than the prompt included), with left-padded prompts and right-padded
responses as ``trainer.collate.pack`` lays them out."""

from __future__ import annotations

import pytest
import torch
from test_sampling_decode import FAMILIES, _model  # the same small attention models

from corl.models.tokenizer import build_char_tokenizer
from corl.trainer import losses
from corl.trainer.losses import response_logps

# (prompt, response) per row: "12+34=" three times, "7+8=" twice, "99+1=" once.
ROWS = [("12+34=", "46"), ("12+34=", "4"), ("12+34=", "47x"), ("7+8=", "15"), ("7+8=", "1"), ("99+1=", "100")]


def _packed(tok):  # type: ignore[no-untyped-def]
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p, _ in ROWS]
    answers = [tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for _, a in ROWS]
    p, t = max(map(len, prompts)), max(map(len, answers))
    ids = torch.full((len(ROWS), p + t), tok.pad_token_id)
    attn = torch.zeros_like(ids)
    for i, (q, a) in enumerate(zip(prompts, answers, strict=True)):
        ids[i, p - len(q) : p], ids[i, p : p + len(a)] = torch.tensor(q), torch.tensor(a)
        attn[i, p - len(q) : p + len(a)] = 1
    return ids, attn, t


def _run(model, ids, attn, t):  # type: ignore[no-untyped-def]
    model.zero_grad()
    logps, ent = response_logps(model, ids, attn, t, temperature=0.8, top_p=0.95)
    mask = attn[:, -t:].float()
    (logps * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps * mask, ent * mask, grads


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_shared_prompt_forward_equals_one_forward_over_every_row(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from trl.trainer.utils import disable_dropout_in_model

    tok = build_char_tokenizer()
    model = _model(family, tok).train()
    disable_dropout_in_model(model)  # as the trainer does
    ids, attn, t = _packed(tok)
    assert losses.shares_prompts(model)
    calls: list[int] = []
    model.register_forward_pre_hook(lambda mod, args, kw: calls.append(kw["input_ids"].numel()), with_kwargs=True)
    shared = _run(model, ids, attn, t)
    # 3 distinct prompts run once (3 x 6 tokens), then every row's response (6 x 4 tokens).
    assert calls == [3 * (ids.size(1) - t), ids.size(0) * t]
    calls.clear()
    monkeypatch.setattr(losses, "shares_prompts", lambda model: False)
    whole = _run(model, ids, attn, t)
    assert calls == [ids.numel()]
    torch.testing.assert_close(shared[0], whole[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(shared[1], whole[1], atol=1e-4, rtol=1e-4)
    assert shared[2].keys() == whole[2].keys() and shared[2]
    for name in whole[2]:
        torch.testing.assert_close(shared[2][name], whole[2][name], atol=1e-5, rtol=1e-3, msg=name)


def test_rows_with_distinct_prompts_or_checkpointing_take_one_forward() -> None:
    tok = build_char_tokenizer()
    model = _model("llama", tok).train()
    ids, attn, t = _packed(tok)
    assert losses._shared_prompt_logits(model, ids[[0, 3, 5]], attn[[0, 3, 5]], t) is None  # nothing shared
    from corl.trainer.policy import enable_gradient_checkpointing

    enable_gradient_checkpointing(model)
    assert not losses.shares_prompts(model)  # checkpointing drops the cache: one forward over every row


def test_a_lora_wrapped_member_shares_prompts_with_the_same_adapter_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    from peft import LoraConfig, get_peft_model

    tok = build_char_tokenizer()
    model = get_peft_model(_model("qwen2", tok), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for n, p in model.named_parameters():  # B starts at zero: give the adapters a value, so A gets gradients
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    ids, attn, t = _packed(tok)
    assert losses.shares_prompts(model)
    shared = _run(model, ids, attn, t)
    monkeypatch.setattr(losses, "shares_prompts", lambda model: False)
    whole = _run(model, ids, attn, t)
    torch.testing.assert_close(shared[0], whole[0], atol=1e-5, rtol=1e-4)
    assert shared[2].keys() == whole[2].keys() and all("lora_" in n for n in whole[2])
    for name in whole[2]:
        torch.testing.assert_close(shared[2][name], whole[2][name], atol=1e-5, rtol=1e-3, msg=name)
