"""Exact top-p (nucleus) truncation without sorting the whole vocabulary.

The rule is HF's ``TopPLogitsWarper`` and vLLM's: a token is dropped when the tokens more probable
than it already hold ``top_p`` of the mass; the most probable token is always kept. Sorting every
row's full vocabulary is what those samplers do, and on a CPU it dominates: for Gemma's 262k-token
vocabulary, sampling 16 rows on one thread took 726 ms a decoding step with the sort and 347 ms
with this (``corl.models.sampling``), and the trainer, which must truncate each position's
distribution the same way, sorts thousands of rows a step (a Gemma micro-batch of 4 x 360 tokens,
forward and backward: 51 s with the sort, 37 s with this). The nucleus lies inside the top k
tokens as soon as those hold ``top_p`` of the mass, so this takes the top k (k = 64, growing 4x
until every row is covered: a full sort only for a row that flat) and decides there. The sampler
(``corl.models.sampling``) and the trainer (``trainer.losses``) share this one function, so their
log-probs are over the same nucleus.
"""

from __future__ import annotations

import torch


def outside_nucleus(logits: torch.Tensor, top_p: float, start_k: int = 64) -> torch.Tensor:
    """Bool mask, shaped like ``logits`` (..., V), of the tokens outside each row's top-p nucleus."""
    probs = logits.detach().float().softmax(-1)
    vocab = probs.size(-1)
    k = min(start_k, vocab)
    while True:
        top, idx = probs.topk(k, dim=-1)  # descending
        before = top.cumsum(-1) - top  # mass of the tokens more probable than each
        if k == vocab or bool((before[..., -1] + top[..., -1] >= top_p).all()):
            break
        k = min(4 * k, vocab)
    drop = before >= top_p
    drop[..., 0] = False
    return torch.ones_like(probs, dtype=torch.bool).scatter_(-1, idx, drop)
