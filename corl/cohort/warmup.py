"""Supervised warm-up that stops a member inside a greedy-accuracy band on held-out prompts.

The useful window is narrow (a tiny model can go from 25% to 68% in 100 steps), so accuracy is
checked often, and a check that jumps over the band rolls the model and optimizer back to the last
below-band snapshot and continues with finer checks and a smaller learning rate. If the band is
still missed after ``max_rollbacks`` or ``max_steps``, the snapshot closest to the band is kept.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from corl.tasks import Example, Task

from .evaluate import greedy_accuracy
from .presets import WarmupSettings

IGNORE = -100


@dataclass
class WarmupResult:
    steps: int  # optimizer steps in the kept weights
    accuracy: float  # greedy accuracy of the kept weights on the check examples
    seconds: float
    in_band: bool
    rollbacks: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, accuracy) at each check


def encode_supervised(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompt + answer + EOS`` right-padded, with labels only on answer and EOS tokens.

    Right padding needs no attention mask in a causal model: pads come after every real token, and
    their labels are ignored, so they change neither the loss nor the positions of real tokens.
    """
    missing = [ex.prompt for ex in examples if ex.answer is None]
    if missing:
        raise ValueError(f"{len(missing)} warm-up examples have no answer, e.g. {missing[0]!r}")
    prompts = tokenizer([ex.prompt for ex in examples], add_special_tokens=False)["input_ids"]
    answers = tokenizer([str(ex.answer) for ex in examples], add_special_tokens=False)["input_ids"]
    rows, labels = [], []
    for p, a in zip(prompts, answers, strict=True):
        a = a + [tokenizer.eos_token_id]
        rows.append(p + a)
        labels.append([IGNORE] * len(p) + a)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
    return ids, lab


def _snapshot(model: PreTrainedModel, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "opt": copy.deepcopy(opt.state_dict()),
    }


def _band_distance(acc: float, band: tuple[float, float]) -> float:
    lo, hi = band
    return max(lo - acc, acc - hi, 0.0)


def warm_up(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    train: Sequence[Example],
    check: Sequence[Example],
    settings: WarmupSettings | None = None,
    *,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    on_check: Callable[[int, float], None] | None = None,
) -> WarmupResult:
    """Train ``model`` in place on ``train`` and leave it at the weights this run keeps.

    ``on_step(step, loss)`` and ``on_check(step, accuracy)`` report progress.
    """
    settings = settings or WarmupSettings()
    t0 = time.perf_counter()
    ids, labels = encode_supervised(tokenizer, train)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=settings.betas)
    band = settings.band
    every, step, rollbacks = settings.check_every, 0, 0
    history: list[tuple[int, float]] = []
    below: tuple[int, dict[str, Any]] | None = None  # last checkpoint under the band
    best: tuple[float, int, float, dict[str, Any]] | None = None  # (distance, step, acc, snapshot)

    def check_now() -> float:
        model.eval()
        acc = greedy_accuracy(model, tokenizer, task, check)
        model.train()
        history.append((step, acc))
        if on_check:
            on_check(step, acc)
        return acc

    model.train()
    while step < settings.max_steps:
        batch = torch.tensor(rng.sample(range(len(ids)), min(settings.batch_size, len(ids))))
        loss = model(input_ids=ids[batch], labels=labels[batch]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if on_step:
            on_step(step, loss.item())
        if band is None or (step % every and step < settings.max_steps):
            continue
        acc = check_now()
        dist = _band_distance(acc, band)
        if dist == 0.0:
            return WarmupResult(step, acc, time.perf_counter() - t0, True, rollbacks, history)
        if best is None or dist < best[0]:
            best = (dist, step, acc, _snapshot(model, opt))
        if acc < band[0]:
            below = (step, _snapshot(model, opt))
        elif below is not None and rollbacks < settings.max_rollbacks:
            # Overshot: go back to just below the band and approach it in smaller steps.
            rollbacks += 1
            step, snap = below
            model.load_state_dict(snap["model"])
            opt.load_state_dict(copy.deepcopy(snap["opt"]))
            for group in opt.param_groups:
                group["lr"] *= settings.fine_lr_scale
            every = settings.fine_check_every
        else:
            break

    if band is None:
        acc = check_now()
        return WarmupResult(step, acc, time.perf_counter() - t0, False, rollbacks, history)
    assert best is not None
    _, step, acc, snap = best
    model.load_state_dict(snap["model"])
    return WarmupResult(step, acc, time.perf_counter() - t0, False, rollbacks, history)
