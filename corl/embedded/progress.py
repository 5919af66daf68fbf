"""What an embedded run shows and records: one snapshot of the run every few seconds."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from rich.table import Table

from corl.proto import RoundStats


@dataclass
class MemberSnapshot:
    weight_version: int | None = None
    mean_reward: float | None = None
    distinct_answers: float | None = None
    label_rate: float | None = None
    # Diagnostics against the data set's answers (TTRL's); never fed back into rewards.
    label_accuracy: float | None = None
    reward_accuracy: float | None = None
    majority_ratio: float | None = None
    label_share: float | None = None  # share of the other members' labels equal to its answer
    backlog: int | None = None
    accuracy: float | None = None  # held-out greedy accuracy at accuracy_version
    accuracy_version: int | None = None
    parsed: float | None = None  # at accuracy_version: share of greedy answers the reader takes
    formatted: float | None = None  # at accuracy_version: share in the form the task asks for
    collapse_alarm: bool = False


@dataclass
class RunSnapshot:
    elapsed_s: float
    rounds: int
    members: dict[str, MemberSnapshot] = field(default_factory=dict)

    def row(self) -> dict:
        return {"time": time.time(), **asdict(self)}

    @classmethod
    def from_row(cls, row: dict) -> RunSnapshot:
        """The snapshot a ``metrics.jsonl`` row recorded (fields this version does not know are skipped)."""
        known = {f.name for f in fields(MemberSnapshot)}
        members = {
            name: MemberSnapshot(**{k: v for k, v in m.items() if k in known}) for name, m in row["members"].items()
        }
        return cls(elapsed_s=float(row["elapsed_s"]), rounds=int(row["rounds"]), members=members)


class MetricsHistory:
    """Append-only JSONL of snapshots, written as the run goes so a crash loses nothing."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, snap: RunSnapshot) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(snap.row()) + "\n")

    def last(self) -> RunSnapshot | None:
        """The newest complete snapshot, where a resumed run goes on from; None when there is none.
        A last line cut short (the run was killed while writing it) is removed, so the resumed run's
        rows start on a line of their own."""
        if not self.path.exists():
            return None
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if complete != data:
            with self.path.open("r+b") as f:
                f.truncate(len(complete))
        lines = [line for line in complete.splitlines() if line.strip()]
        return RunSnapshot.from_row(json.loads(lines[-1])) if lines else None


def _fmt(x: float | int | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def summary_line(snap: RunSnapshot, target_rounds: int | None) -> str:
    """One plain line per round for consoles that are not terminals (logs), where a live table never draws."""
    members = ", ".join(
        f"{name} v{_fmt(m.weight_version, 'd')} reward {_fmt(m.mean_reward)}" for name, m in snap.members.items()
    )
    return f"round {snap.rounds}/{target_rounds or '-'} ({snap.elapsed_s:.0f}s): {members}"


def render(snap: RunSnapshot, target_rounds: int | None) -> Table:
    total = f"/{target_rounds}" if target_rounds else ""
    table = Table(title=f"corl run: round {snap.rounds}{total}, {snap.elapsed_s:.0f}s")
    cols = ("member", "version", "mean reward", "labelled", "distinct/G", "was label", "backlog", "held-out acc")
    for col in (*cols, "alarm"):
        table.add_column(col, justify="right" if col != "member" else "left")
    for name, m in snap.members.items():
        acc = "-" if m.accuracy is None else f"{m.accuracy:.3f} (v{m.accuracy_version})"
        table.add_row(
            name,
            _fmt(m.weight_version, "d"),
            _fmt(m.mean_reward),
            _fmt(m.label_rate, ".2f"),
            _fmt(m.distinct_answers, ".2f"),
            _fmt(m.label_share, ".2f"),
            _fmt(m.backlog, "d"),
            acc,
            "COLLAPSE" if m.collapse_alarm else "",
        )
    return table


class RoundLog:
    """Append-only JSONL of every committed round's statistics (``RoundStats``), one line a round, in
    round order: what the snapshots (the latest round every few seconds) skip, kept for analysis."""

    POLL_ROUNDS = 32  # rounds each stats poll reads back: more than a poll interval ever commits

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.next_round = self._next_round()

    def _next_round(self) -> int:
        """The round after the last one written; a last line cut short (a kill) is removed first."""
        if not self.path.exists():
            return 0
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if complete != data:
            with self.path.open("r+b") as f:
                f.truncate(len(complete))
        rounds = [json.loads(line)["round"] for line in complete.splitlines() if line.strip()]
        return max(rounds, default=-1) + 1

    def extend(self, rounds: Sequence[RoundStats]) -> None:
        """Append the rounds not written yet (a resumed run sends some again)."""
        new = [r for r in rounds if r.round >= self.next_round]
        if not new:
            return
        with self.path.open("a") as f:
            for r in sorted(new, key=lambda r: r.round):
                f.write(r.model_dump_json() + "\n")
        self.next_round = max(r.round for r in new) + 1
