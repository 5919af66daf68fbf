"""Per-round diagnostics (computed with ``corl.rewards`` math) and the run's stats view.

Dataset answers meet labels here only, to log pseudo-label accuracy; nothing here feeds rewards.
"""

from __future__ import annotations

from collections.abc import Sequence

from corl.proto import BatchDiagnostics, MemberRoundStats, RoundStats, RunStats
from corl.rewards import answer_stats, label_accuracy


def member_diagnostics(
    answers: Sequence[Sequence[str | None]],
    rewards: Sequence[Sequence[float]],
    labels: Sequence[str | None],
    response_tokens: int,
) -> tuple[BatchDiagnostics, float]:
    """A member's batch diagnostics and its distinct-answer rate (distinct / G, the collapse signal)."""
    n_samples = sum(len(r) for r in rewards) or 1
    distinct = entropy = rate = 0.0
    for samples in answers:
        d, h = answer_stats(samples)
        distinct += d
        entropy += h
        rate += d / len(samples) if samples else 0.0
    n_prompts = len(answers) or 1
    diag = BatchDiagnostics(
        mean_reward=sum(map(sum, rewards)) / n_samples,
        label_rate=sum(1 for lab in labels if lab is not None) / (len(labels) or 1),
        distinct_answers=distinct / n_prompts,
        answer_entropy=entropy / n_prompts,
        mean_response_tokens=response_tokens / n_samples,
    )
    return diag, rate / n_prompts


def member_round_stats(
    diag: BatchDiagnostics,
    pseudo_labels: Sequence[str | None],
    dataset_answers: Sequence[str | None],
    written: bool,
) -> MemberRoundStats:
    return MemberRoundStats(
        **diag.model_dump(),
        pseudo_label_accuracy=label_accuracy(pseudo_labels, dataset_answers),
        batch_written=written,
    )


def run_stats(
    run_id: str, next_round: int, rounds_json: list[str], learnt: dict[str, dict], collapse: list[str]
) -> RunStats:
    rel = learnt.get("reliability", {})
    return RunStats(
        run_id=run_id,
        next_round=next_round,
        rounds=[RoundStats.model_validate_json(r) for r in rounds_json],
        grader_weights={g: float(w) for g, w in rel.get("effective_weights", {}).items()},
        quarantined=list(rel.get("quarantined", [])),
        collapse=sorted(collapse),
    )
