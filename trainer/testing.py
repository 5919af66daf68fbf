"""Graded batches made without an aggregator, for tests and benchmarks of the trainer.

results = sample(model, tok, prompts, n=4, max_tokens=4, seed=0)
batch = batch_from_samples(results, prompts, rewards=lambda p, j: float(j % 2))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from corl.models.sampling import PromptCompletions
from corl.proto import BatchDiagnostics, GradedBatch, PromptGroup, SamplingSettings


def batch_from_samples(
    results: Sequence[PromptCompletions],
    prompts: Sequence[str],
    *,
    sampling: SamplingSettings,
    rewards: Callable[[int, int], float] = lambda p, j: float(j % 2),
    run_id: str = "test",
    member: str = "a",
    round_: int = 0,
    version: int = 0,
    batch_id: str | None = None,
) -> GradedBatch:
    """A ``GradedBatch`` of ``corl.models.sampling.sample`` output; ``rewards(prompt, sample)``."""
    bid = batch_id or f"{run_id}-r{round_:07d}-{member}"
    groups = [
        PromptGroup(
            group_id=f"{bid}-p{p}",
            prompt=prompts[p],
            prompt_token_ids=r.prompt_token_ids,
            samples=[
                {  # type: ignore[list-item]
                    "sample_id": f"{bid}-p{p}-s{j}",
                    "response": c.text,
                    "response_token_ids": c.token_ids,
                    "logprobs": c.logprobs,
                    "finish_reason": c.finish_reason,
                    "weight_version": version,
                    "reward": rewards(p, j),
                }
                for j, c in enumerate(r.completions)
            ],
        )
        for p, r in enumerate(results)
    ]
    n = sum(len(g.samples) for g in groups)
    mean = sum(s.reward for g in groups for s in g.samples) / n
    tokens = sum(len(s.response_token_ids) for g in groups for s in g.samples) / n
    return GradedBatch(
        batch_id=bid,
        run_id=run_id,
        round=round_,
        member=member,
        reward_mode="peer_label",
        created_at=time.time(),
        sampling=sampling,
        groups=groups,
        diagnostics=BatchDiagnostics(
            mean_reward=mean, label_rate=1.0, distinct_answers=1.0, answer_entropy=0.0, mean_response_tokens=tokens
        ),
    )
