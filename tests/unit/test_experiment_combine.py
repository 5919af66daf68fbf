"""Combining experiments: a config variant of a mode is its own row, measured against the same
ground-truth runs, and its diagnostics come from its own runs."""

from __future__ import annotations

import json
from pathlib import Path

from corl.experiment.combine import combine, variant_label
from corl.experiment.report import METRICS, MemberResult, markdown_table, write_summary_csv


def _experiment(out: Path, rows: list[tuple[str, int, float, float]], overrides: dict) -> None:
    out.mkdir(parents=True)
    results = [
        MemberResult(mode, seed, "m", dict.fromkeys(METRICS, b), dict.fromkeys(METRICS, a), 80)
        for mode, seed, b, a in rows
    ]
    write_summary_csv(results, out / "summary.csv")
    (out / "experiment.json").write_text(json.dumps({"overrides": overrides}))
    for mode in {r[0] for r in rows if r[0] != "none"}:
        run = out / "runs" / f"{mode}-seed0"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"version": 1, "members": {"m": {"label_accuracy": 0.5}}}) + "\n")


def test_variants_are_rows_of_their_own_against_the_same_ground_truth(tmp_path: Path) -> None:
    base, variant = tmp_path / "base", tmp_path / "variant"
    _experiment(base, [("none", 0, 0.4, 0.4), ("ground_truth", 0, 0.4, 0.6), ("peer_pool", 0, 0.4, 0.5)], {})
    votes = {"reward.votes.samples": 1, "reward.votes.temperature": 0}
    _experiment(variant, [("peer_pool", 0, 0.4, 0.56)], votes)
    results, histories, labels = combine([base, variant])
    label = "peer_pool [votes.samples=1, votes.temperature=0]"
    assert variant_label("peer_pool", votes) == label
    assert labels == ["none", "ground_truth", "peer_pool", label]
    assert set(histories) == {"ground_truth", "peer_pool", label}
    table = markdown_table(results, labels)
    shares = {line.split(" | ")[0][2:]: line.split(" | ")[-1].rstrip(" |") for line in table.splitlines()[3:]}
    assert shares["peer_pool"] == "50%" and shares[label] == "80%"
