"""Encoding a member's graded batch for its Redis stream."""

from __future__ import annotations

from pydantic_core import to_json

from corl.proto import GenerateResponse, SamplingSettings
from corl.rewards import MemberOutcome


def batch_id(run: str, round_: int, member: str) -> str:
    """Deterministic: the same (run, round, member) always names the same batch."""
    return f"{run}-r{round_:07d}-{member}"


def graded_batch_json(
    run_id: str,
    round_: int,
    member: str,
    reward_mode: str,
    sampling: SamplingSettings,
    resp: GenerateResponse,
    outcome: MemberOutcome,
    now: float,
) -> bytes:
    """``GradedBatch.model_dump_json()`` of a member's batch, built from plain dicts.

    Every field comes from validated inputs, and a round builds N*B*G samples, so per-sample
    model construction would dominate the round's cost; the JSON is byte-for-byte what the
    model would dump (a test checks it round-trips through ``GradedBatch``).
    """
    bid = batch_id(run_id, round_, member)
    version = resp.weight_version
    groups = []
    for p, pr in enumerate(resp.results):
        gid = f"{bid}-p{p}"
        rewards, answers = outcome.rewards[p], outcome.answers[p]
        samples = [
            {
                "sample_id": f"{gid}-s{s}",
                "response": smp.text,
                "response_token_ids": smp.token_ids,
                "logprobs": smp.logprobs,
                "finish_reason": smp.finish_reason,
                "weight_version": version,
                "reward": float(rewards[s]),
                "answer": answers[s],
            }
            for s, smp in enumerate(pr.samples)
        ]
        groups.append(
            {
                "group_id": gid,
                "prompt": pr.prompt,
                "prompt_token_ids": pr.prompt_token_ids,
                "samples": samples,
                "weight": float(outcome.weights[p]),
            }
        )
    batch = {
        "batch_id": bid,
        "run_id": run_id,
        "round": round_,
        "member": member,
        "reward_mode": reward_mode,
        "created_at": now,
        "sampling": sampling.model_dump(),
        "groups": groups,
        "diagnostics": outcome.diagnostics.model_dump(),
    }
    return to_json(batch)
