"""One table from several experiments: ``corl experiment``'s output directories, each run with its
own ``--set`` overrides, combined into one summary.csv and results.md. A row is labelled by its
mode and, when its experiment changed the config, by the overrides (``peer_pool [votes.samples=1]``),
so a config variant of a mode reads as its own row, compared against the same ground-truth runs."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from .report import METRICS, MemberResult, load_history


def variant_label(mode: str, overrides: Mapping[str, object]) -> str:
    """``mode`` alone, or with the experiment's overrides (``reward.`` dropped) in brackets."""
    extra = {k.removeprefix("reward."): v for k, v in overrides.items() if k != "reward.mode"}
    return mode if not extra else f"{mode} [{', '.join(f'{k}={v}' for k, v in sorted(extra.items()))}]"


def _floats(row: Mapping[str, str], when: str) -> dict[str, float]:
    return {k: float(row[f"{when}_{k}"]) for k in METRICS if row.get(f"{when}_{k}", "") != ""}


def read_experiment(out: Path) -> tuple[list[MemberResult], dict[str, list[dict]]]:
    """An experiment directory's rows, relabelled by its overrides, and the first seed's histories."""
    meta = json.loads((out / "experiment.json").read_text())
    overrides = meta.get("overrides") or {}
    with (out / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    results = [
        MemberResult(
            variant_label(r["mode"], overrides) if r["mode"] != "none" else "none",
            int(r["seed"]),
            r["member"],
            _floats(r, "before"),
            _floats(r, "after"),
            int(r["steps"]),
        )
        for r in rows
    ]
    first = min((r.seed for r in results), default=0)
    histories = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        path = out / "runs" / f"{mode}-seed{first}" / "metrics.jsonl"
        if path.exists():
            histories[variant_label(mode, overrides)] = load_history(path)
    return results, histories


def combine(dirs: Sequence[Path]) -> tuple[list[MemberResult], dict[str, list[dict]], list[str]]:
    """Every experiment's rows (a label met twice keeps its first experiment's rows), their first
    seed's histories, and the row labels in order of appearance."""
    results: list[MemberResult] = []
    histories: dict[str, list[dict]] = {}
    labels: list[str] = []
    for out in dirs:
        rows, hist = read_experiment(out)
        new = [r for r in rows if r.mode not in labels]
        results += new
        labels += [m for m in dict.fromkeys(r.mode for r in new)]
        histories.update({k: v for k, v in hist.items() if k not in histories})
    return results, histories, labels
