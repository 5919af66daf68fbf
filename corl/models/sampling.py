"""Batched sampling from a transformers causal LM with the log-probability of every sampled token.

The log-probs are taken from the *processed* scores (after temperature and top-p), normalised, so
they are the sampling distribution's: what a trainer needs for its off-policy importance ratio.
This runs synchronously; callers on an event loop run it in a worker thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


class _DropUnmaskedPaddingWarning(logging.Filter):
    """transformers' GPT-2 warns once, from inside ``generate``'s decode steps, that padding may be
    unmasked. It is masked: ``tests/unit/test_losses_logps.py`` checks left-padded sampling
    log-probs against the trainer's own forward pass. The warning would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "passing in an `attention_mask`" not in record.getMessage()


logging.getLogger("transformers.modeling_utils").addFilter(_DropUnmaskedPaddingWarning())


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


@dataclass(frozen=True)
class PromptCompletions:
    prompt_token_ids: list[int]
    completions: list[Completion]


@torch.inference_mode()
def sample(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    n: int = 1,
    max_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> list[PromptCompletions]:
    """Sample ``n`` completions for each prompt. ``temperature == 0`` is greedy."""
    if seed is not None:
        torch.manual_seed(seed)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    device = next(model.parameters()).device
    input_ids = enc["input_ids"].to(device)
    attention_mask = enc["attention_mask"].to(device)
    greedy = temperature == 0.0
    gen_kwargs: dict = dict(
        max_new_tokens=max_tokens,
        do_sample=not greedy,
        num_return_sequences=n,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if greedy:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)
    else:
        gen_kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **gen_kwargs)  # type: ignore[operator]
    new_tokens = out.sequences[:, input_ids.shape[1] :]
    # scores: one (batch*n, vocab) tensor per step, already temperature/top-p processed.
    scores = torch.stack(out.scores, dim=1).float().log_softmax(dim=-1)
    token_logprobs = scores.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)

    eos = tokenizer.eos_token_id
    results: list[PromptCompletions] = []
    for p in range(len(prompts)):
        mask = attention_mask[p].bool()
        prompt_ids = input_ids[p][mask].tolist()
        completions = []
        for row in range(p * n, (p + 1) * n):
            ids = new_tokens[row].tolist()
            lps = token_logprobs[row].tolist()
            finish = "length"
            if eos in ids:
                cut = ids.index(eos) + 1
                ids, lps, finish = ids[:cut], lps[:cut], "stop"
            text = str(tokenizer.decode(ids, skip_special_tokens=True))
            completions.append(Completion(text, ids, lps, finish))
        results.append(PromptCompletions(prompt_ids, completions))
    return results
