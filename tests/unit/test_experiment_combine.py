"""Combining experiments: a config variant of a mode is its own row, measured against the same
ground-truth runs, and its diagnostics come from its own runs."""

from __future__ import annotations

import json
from pathlib import Path

from corl.config.reward import RewardConfig
from corl.experiment.combine import combine, reward_settings, variant_label
from corl.experiment.report import METRICS, MemberResult, markdown_table, write_summary_csv


def _experiment(
    out: Path, rows: list[tuple[str, int, float, float]], overrides: dict, reward: dict | None = None
) -> None:
    out.mkdir(parents=True)
    results = [
        MemberResult(mode, seed, "m", dict.fromkeys(METRICS, b), dict.fromkeys(METRICS, a), 80)
        for mode, seed, b, a in rows
    ]
    write_summary_csv(results, out / "summary.csv")
    meta = {"overrides": overrides} | ({"reward": reward} if reward is not None else {})
    (out / "experiment.json").write_text(json.dumps(meta))
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
    assert variant_label("peer_pool", {"votes.samples": 1, "votes.temperature": 0}) == label
    assert labels == ["none", "ground_truth", "peer_pool", label]
    assert set(histories) == {"ground_truth", "peer_pool", label}
    table = markdown_table(results, labels)
    shares = {line.split(" | ")[0][2:]: line.split(" | ")[-1].rstrip(" |") for line in table.splitlines()[3:]}
    assert shares["peer_pool"] == "50%" and shares[label] == "80%"


def test_rows_are_labelled_by_the_reward_settings_they_ran_with_from_the_config_file_too(tmp_path: Path) -> None:
    """Vote settings written in the config file (no ``--set``) label the runs that read votes, and only
    those; an experiment of the default settings is plain ``peer_pool``, whatever ``--set`` spelt out."""
    from_config = RewardConfig.model_validate({"mode": "peer_pool", "votes": {"samples": 8, "temperature": 0.5}})
    spelt_default = RewardConfig.model_validate(
        {"votes": {"samples": 0, "temperature": 0}, "guard": {"action": "hold"}}
    )
    assert reward_settings(from_config) == {"votes.samples": 8, "votes.temperature": 0.5}
    assert reward_settings(spelt_default) == {"guard.action": "hold"}
    assert reward_settings(RewardConfig(mode="ground_truth")) == {}

    study, default = tmp_path / "study", tmp_path / "default"
    rows = [("ground_truth", 0, 0.4, 0.6), ("random", 0, 0.4, 0.42), ("peer_pool", 0, 0.4, 0.5)]
    _experiment(study, rows, {}, reward_settings(from_config))
    overrides = {"reward.votes.samples": 0, "reward.votes.temperature": 0, "training.lr": 1e-5}
    _experiment(default, [("peer_pool", 0, 0.4, 0.45)], overrides, reward_settings(RewardConfig()))
    _, _, labels = combine([study, default])
    assert labels == [
        "ground_truth",
        "random",
        "peer_pool [votes.samples=8, votes.temperature=0.5]",
        "peer_pool [training.lr=1e-05]",
    ]
