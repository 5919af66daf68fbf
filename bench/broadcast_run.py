"""How a finished run's weight versions went, from its run directory: per trained member, the versions
its trainer published and how (broadcast or files), the versions each server replica swapped in, and
whether every published version reached every replica; the run's round time from ``rounds.jsonl``.

    python bench/broadcast_run.py RUN_DIR [RUN_DIR ...]

For comparing ``training.weight_transfer: broadcast`` against ``files`` on the same config (docs/SCALING.md,
"Measured"): e.g. the trio with one member trained in full weights, a version every step:

    corl cohort init --preset trio --out cohort/trio
    corl run --config examples/trio-full-broadcast.yaml --rounds 40 --out runs/trio-full-broadcast
    sed 's/weight_transfer: broadcast/weight_transfer: files/' examples/trio-full-broadcast.yaml \\
        > examples/trio-full-files.yaml
    corl run --config examples/trio-full-files.yaml --rounds 40 --out runs/trio-full-files
    python bench/broadcast_run.py runs/trio-full-broadcast runs/trio-full-files
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

PUBLISHED = re.compile(r"published (\S+) version (\d+) \(\w+\): (broadcast to \[([^\]]*)\])?")
SWAPPED = re.compile(r"weights (\d+) -> (\d+)( by broadcast)? in ([\d.]+)s")


def round_seconds(run_dir: Path) -> list[float]:
    """Seconds between consecutive committed rounds."""
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines() if line.strip()]
    times = sorted(r["created_at"] for r in rounds)
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def member_versions(run_dir: Path, member: str) -> dict[str, Any]:
    """What the member's trainer published and what each of its servers swapped in (from their logs)."""
    published, by_broadcast = [], 0
    for m in PUBLISHED.finditer((run_dir / "logs" / f"trainer-{member}.log").read_text(errors="replace")):
        if m.group(1) == member:
            published.append(int(m.group(2)))
            by_broadcast += bool(m.group(3)) and bool(m.group(4))
    servers = {}
    for log in sorted((run_dir / "logs").glob(f"server-{member}-*.log")):
        swaps = [(int(m.group(2)), bool(m.group(3)), float(m.group(4))) for m in SWAPPED.finditer(log.read_text())]
        servers[log.stem] = {
            "swapped": len(swaps),
            "by_broadcast": sum(b for _, b, _ in swaps),
            "median_swap_s": statistics.median(s for _, _, s in swaps) if swaps else None,
            "missing": sorted(set(published) - {v for v, _, _ in swaps}),
        }
    return {"published": len(published), "by_broadcast": by_broadcast, "servers": servers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (corl run --out)")
    args = ap.parse_args()
    for run_dir in args.runs:
        trained = sorted(p.stem.removeprefix("trainer-") for p in (run_dir / "logs").glob("trainer-*.log"))
        gaps = round_seconds(run_dir)
        members = {m: member_versions(run_dir, m) for m in trained}
        report = {
            "run": str(run_dir),
            "rounds": len(gaps) + 1,
            "mean_round_s": round(statistics.fmean(gaps), 2) if gaps else None,
            "median_round_s": round(statistics.median(gaps), 2) if gaps else None,
            "members": members,
        }
        every = all(not s["missing"] for m in members.values() for s in m["servers"].values())
        print(json.dumps({**report, "every_version_swapped": every}, indent=2))


if __name__ == "__main__":
    main()
