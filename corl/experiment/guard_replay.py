"""The collapse guard replayed on finished runs: when it would have tripped, and what the member's
held-out accuracy did, from the rounds a run recorded (``rounds.jsonl``) and its ``result.json``.

Replaying is exact for the guard's own state (it reads nothing but the round statistics), so a run
made with ``action: alarm`` shows what ``action: hold`` would have stopped and when; what the member
would have scored had it been held is its held-out accuracy at that version, which only a run with
``hold`` measures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from corl.config import GuardConfig
from corl.proto import RoundStats
from corl.rewards.guard import CollapseGuard, GuardBounds, GuardSignals


def bounds_of(g: GuardConfig) -> GuardBounds:
    return GuardBounds(**g.model_dump(exclude={"action"}))


@dataclass(frozen=True)
class Trip:
    member: str
    round: int | None  # None: never tripped
    signals: tuple[str, ...]
    start: GuardSignals | None


def replay(rounds: list[RoundStats], bounds: GuardBounds, samples_per_prompt: int) -> dict[str, Trip]:
    """Each member's first tripped round under ``bounds`` (rounds in order, as recorded)."""
    guard = CollapseGuard(bounds)
    trips: dict[str, Trip] = {}
    for r in sorted(rounds, key=lambda r: r.round):
        for name, m in r.members.items():
            if m.echo_share is None or m.formatted_share is None:
                continue  # recorded before the guard's signals were
            signals = GuardSignals(m.distinct_answers / samples_per_prompt, m.echo_share, m.formatted_share)
            if guard.update(name, signals) and name not in trips:
                trips[name] = Trip(name, r.round, tuple(guard.tripped[name]), guard.start.get(name))
    for name in guard.start:
        trips.setdefault(name, Trip(name, None, (), guard.start[name]))
    return trips


def read_rounds(run_dir: Path) -> list[RoundStats]:
    path = run_dir / "rounds.jsonl"
    if not path.exists():
        return []
    return [RoundStats.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def guard_table(run_dirs: list[Path], bounds: GuardBounds, samples_per_prompt: int) -> str:
    """A markdown table: per run and member, held-out accuracy before -> after, the guard's start
    signals and the round it trips at (with the signals past their bounds)."""
    lines = [
        "| run | member | accuracy before -> after | start echo / formatted | trips at round | signals |",
        "|---|---|---|---|---|---|",
    ]
    for run_dir in run_dirs:
        results = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").exists() else []
        acc = {r["member"]: (r["before"]["greedy_acc"], r["after"]["greedy_acc"]) for r in results}
        trips = replay(read_rounds(run_dir), bounds, samples_per_prompt)
        for name in sorted(set(acc) | set(trips)):
            t = trips.get(name)
            before_after = f"{acc[name][0]:.3f} -> {acc[name][1]:.3f}" if name in acc else "-"
            start = f"{t.start.echo_share:.2f} / {t.start.formatted_share:.2f}" if t and t.start else "-"
            at = str(t.round) if t and t.round is not None else "-"
            lines.append(
                f"| {run_dir.name} | {name} | {before_after} | {start} | {at} | {', '.join(t.signals) if t else ''} |"
            )
    return "\n".join(lines) + "\n"
