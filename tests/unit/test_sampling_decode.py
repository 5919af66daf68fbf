"""The sampler's own decode loop (attention families) against ``model.generate``: the same greedy
tokens and log-probs with left padding, end tokens and stop strings; each prompt prefilled once;
ended rows leave the batch."""

from __future__ import annotations

import pytest
import torch

from corl.cohort.presets import MemberSpec
from corl.models import sampling
from corl.models.sampling import sample
from corl.models.tokenizer import build_char_tokenizer

_ATTN = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
FAMILIES = {
    "gpt2": dict(n_embd=32, n_layer=2, n_head=2),
    "llama": _ATTN,
    "qwen2": _ATTN,
    # Sliding-window layers (window 4 < the prompts) beside a full-attention one.
    "gemma3_text": dict(
        _ATTN,
        head_dim=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.02,
    ),
}
PROMPTS = ["1+2=", "12+34=", "7+80+9="]


def _model(family: str, tok):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    arch = {"initializer_range": 0.3, **FAMILIES[family]}  # peaked distributions: varied greedy text
    cfg = MemberSpec(family, family, arch).build_config(tok, max_positions=64)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _via_generate(monkeypatch: pytest.MonkeyPatch, **kwargs):  # type: ignore[no-untyped-def]
    with monkeypatch.context() as m:
        m.setattr(sampling, "DynamicLayer", type("NoLayer", (), {}))  # no cache qualifies: model.generate
        return sample(**kwargs)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("rule", ["end token", "stop string"])
def test_greedy_decode_matches_generate(family: str, rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = build_char_tokenizer("0123456789+=")
    model = _model(family, tok)
    kwargs = dict(model=model, tokenizer=tok, prompts=PROMPTS, n=1, max_tokens=10, temperature=0.0)
    row0 = sample(**kwargs)[0].completions[0]  # random weights: no row writes the end token by itself
    # Row 0 ends early (by its 4th character), by the rule under test; the others when they meet it.
    if rule == "end token":
        model.generation_config.eos_token_id = [tok.eos_token_id, row0.token_ids[3]]
    else:
        kwargs["stop"] = (row0.text[3],)
    ours, theirs = sample(**kwargs), _via_generate(monkeypatch, **kwargs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        for ca, cb in zip(a.completions, b.completions, strict=True):
            assert (ca.text, ca.token_ids, ca.finish_reason) == (cb.text, cb.token_ids, cb.finish_reason)
            assert ca.logprobs == pytest.approx(cb.logprobs, abs=1e-4)
    first = ours[0].completions[0]
    assert first.finish_reason == "stop" and first.token_ids == row0.token_ids[: len(first.token_ids)]
    assert len(first.token_ids) < len(row0.token_ids)


def test_each_prompt_is_prefilled_once_and_ended_rows_leave_the_batch() -> None:
    tok = build_char_tokenizer()
    model = _model("llama", tok)
    seen: list[tuple[int, int]] = []  # (rows, tokens) of every forward
    model.model.register_forward_hook(
        lambda mod, args, kw, out: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    results = sample(model, tok, PROMPTS, n=4, max_tokens=10, temperature=1.0, seed=3)
    prefill, *steps = seen
    assert prefill[0] == len(PROMPTS) and prefill[1] > 1  # 3 prompt rows, not 12
    assert all(t == 1 for _, t in steps)
    lengths = sorted(len(c.token_ids) for r in results for c in r.completions)
    assert lengths[0] < lengths[-1], "the test needs rows that end at different steps"
    # The batch at step k holds exactly the rows that had not ended before it.
    assert [rows for rows, _ in steps] == [sum(1 for n in lengths if n > k) for k in range(1, len(steps) + 1)]


class _CacheNamedPastKeyValues(torch.nn.Module):
    """A causal LM whose ``forward`` takes its cache as ``past_key_values``, as transformers 4's do
    (the vLLM environment's); unknown keywords vanish into ``**kwargs`` as theirs do."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.config, self.generation_config = inner, inner.config, inner.generation_config

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):  # type: ignore[no-untyped-def]
        keep = {k: kwargs[k] for k in ("use_cache", "logits_to_keep") if k in kwargs}
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=past_key_values, **keep
        )


def test_the_cache_is_passed_by_the_name_the_model_takes() -> None:
    tok = build_char_tokenizer()
    model = _model("llama", tok)
    old = _CacheNamedPastKeyValues(model)
    assert sampling.cache_argument(model) == "cache"
    assert sampling.cache_argument(old) == "past_key_values"
    kwargs = dict(tokenizer=tok, prompts=PROMPTS, n=2, max_tokens=8, temperature=0.0)
    assert sample(old, **kwargs) == sample(model, **kwargs)


@pytest.mark.parametrize("path", ["decode loop", "model.generate"])
def test_on_step_hears_each_token_as_it_is_sampled_and_changes_nothing(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = build_char_tokenizer("0123456789+=")
    model = _model("llama", tok)
    kwargs = dict(model=model, tokenizer=tok, prompts=PROMPTS, n=2, max_tokens=10, temperature=1.0, seed=3, stop=("=",))
    run = sample if path == "decode loop" else lambda **kw: _via_generate(monkeypatch, **kw)
    steps: list[list[tuple[int, int, float]]] = []
    heard = run(**kwargs, on_step=steps.append)
    assert heard == run(**kwargs), "listening changed the samples"
    completions = [c for r in heard for c in r.completions]
    assert len({len(c.token_ids) for c in completions}) > 1, "the test needs rows that end at different steps"
    # Step k holds one token of every row that had not ended before it, the token that ends a row included.
    assert [sorted(r for r, _, _ in step) for step in steps] == [
        [r for r, c in enumerate(completions) if len(c.token_ids) > k] for k in range(len(steps))
    ]
    for r, c in enumerate(completions):
        assert [(t, lp) for step in steps for row, t, lp in step if row == r] == list(
            zip(c.token_ids, c.logprobs, strict=True)
        )
