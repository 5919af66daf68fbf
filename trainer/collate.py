"""Pack graded samples into tensors without re-tokenising: the batch carries the member's own ids.

Layout per row: ``[pad.. prompt | response ..pad]``: prompts left-padded to the longest prompt and
responses right-padded to the longest response, so every response starts at the same column and
the loss mask covers response tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from corl.proto import GradedSample, PromptGroup


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T)
    response_mask: torch.Tensor  # (B, T) float
    old_logps: torch.Tensor  # (B, T) sampling log-probs, 0 on padding
    response_len: int  # T

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


def pack(rows: Sequence[tuple[PromptGroup, GradedSample]], pad_token_id: int) -> PackedBatch:
    """Pack (group, sample) rows (``GradedBatch.samples()``): the group holds the prompt's ids."""
    if not rows:
        raise ValueError("nothing to pack")
    for _, s in rows:
        if len(s.logprobs) != len(s.response_token_ids):
            raise ValueError(f"sample {s.sample_id}: {len(s.logprobs)} logprobs for {len(s.response_token_ids)} tokens")
    p = max(len(g.prompt_token_ids) for g, _ in rows)
    t = max(max(len(s.response_token_ids) for _, s in rows), 1)
    b = len(rows)
    ids = torch.full((b, p + t), pad_token_id, dtype=torch.long)
    attn = torch.zeros((b, p + t), dtype=torch.long)
    old = torch.zeros((b, t), dtype=torch.float32)
    for i, (g, s) in enumerate(rows):
        lp, lr = len(g.prompt_token_ids), len(s.response_token_ids)
        ids[i, p - lp : p] = torch.tensor(g.prompt_token_ids)
        attn[i, p - lp : p] = 1
        if lr:
            ids[i, p : p + lr] = torch.tensor(s.response_token_ids)
            attn[i, p : p + lr] = 1
            old[i, :lr] = torch.tensor(s.logprobs)
    return PackedBatch(ids, attn, attn[:, p:].float(), old, t)
