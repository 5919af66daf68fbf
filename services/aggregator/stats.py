"""The run's statistics: one ``RoundStats`` per committed round, and the ``RunStats`` view.

Dataset answers meet labels only in ``pseudo_label_accuracy``, a diagnostic; nothing here feeds rewards.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from corl.proto import EndpointStats, HeldoutAccuracy, MemberRoundStats, RoundStats, RunStats
from corl.proto.gateway import HarvestStats
from corl.rewards import GraderReliability, RoundOutcome
from corl.tracking import Record


def round_stats(
    round_: int,
    now: float,
    outcome: RoundOutcome,
    missing: Sequence[str],
    written: Collection[str],
    harvested: Sequence[str] = (),
) -> RoundStats:
    members = {
        name: MemberRoundStats(
            **o.diagnostics.model_dump(),
            pseudo_label_accuracy=o.pseudo_label_accuracy,
            label_accuracy=o.label_accuracy,
            reward_accuracy=o.reward_accuracy,
            majority_ratio=o.majority_ratio,
            label_share=o.label_share,
            echo_share=o.echo_share,
            formatted_share=o.formatted_share,
            batch_written=name in written,
        )
        for name, o in outcome.members.items()
    }
    return RoundStats(
        round=round_,
        created_at=now,
        members=members,
        missing=list(missing),
        agreement=outcome.agreement,
        cohort_diversity=outcome.cohort_diversity,
        harvested=list(harvested),
    )


def round_records(stats: RoundStats, alarms: Mapping[str, bool]) -> list[Record]:
    """A committed round for experiment trackers, against the round: each member's figures (reward,
    labelled fraction, distinct answers, label diagnostics, collapse alarm) and the cohort's."""
    records = []
    for name, m in stats.members.items():
        values = {k: float(v) for k, v in m.model_dump(exclude={"batch_written"}).items() if v is not None}
        values["collapse_alarm"] = float(alarms.get(name, False))
        records.append(Record(f"{name}/round", "round", stats.round, values))
    cohort = {"diversity": stats.cohort_diversity, "members_missing": float(len(stats.missing))}
    return [*records, Record("cohort/round", "round", stats.round, cohort)]


def run_stats(
    run_id: str,
    next_round: int,
    rounds_json: list[str],
    reliability: GraderReliability,
    collapse: Collection[str],
    endpoints: Mapping[str, EndpointStats] | None = None,
    heldout: Mapping[str, HeldoutAccuracy] | None = None,
    harvest: HarvestStats | None = None,
    weight_transfer: Mapping[str, str] | None = None,
) -> RunStats:
    return RunStats(
        run_id=run_id,
        next_round=next_round,
        rounds=[RoundStats.model_validate_json(r) for r in rounds_json],
        grader_weights=reliability.effective_weights(),
        quarantined=sorted(reliability.quarantined),
        collapse=sorted(collapse),
        endpoints=dict(endpoints or {}),
        heldout=dict(heldout or {}),
        harvest=harvest,
        weight_transfer=dict(weight_transfer or {}),
    )
