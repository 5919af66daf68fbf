"""One table from several experiments: ``corl experiment``'s output directories, each run with its
own config file or ``--set`` overrides, combined into one summary.csv and results.md. A row is
labelled by its mode and, where its experiment's reward settings differ from the defaults or it set
other overrides, by those (``peer_pool [votes.samples=8, votes.temperature=0.5]``), so a config
variant of a mode reads as its own row, compared against the same ground-truth runs."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from corl.config.reward import RewardConfig
from corl.proto import VOTE_READING_MODES

from .report import METRICS, MemberResult, load_history


def reward_settings(reward: RewardConfig) -> dict[str, object]:
    """A run's reward settings that differ from the defaults, flattened (``votes.samples``), its mode
    aside: what an experiment records so that its rows are labelled by what they ran with, whether the
    setting came from ``--set`` or from the config file."""

    def flat(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, Mapping) else {f"{prefix}{k}": v})
        return out

    return {k: v for k, v in flat(reward.model_dump(exclude_defaults=True)).items() if k != "mode"}


def experiment_settings(meta: Mapping[str, object]) -> dict[str, object]:
    """An experiment's settings for its labels: its recorded reward settings and its other overrides
    (an experiment.json written before reward settings were recorded: its ``reward.`` overrides)."""
    overrides: Mapping[str, object] = meta.get("overrides") or {}  # type: ignore[assignment]
    reward = meta.get("reward")
    if reward is None:
        reward = {k.removeprefix("reward."): v for k, v in overrides.items() if k.startswith("reward.")}
    others = {k: v for k, v in overrides.items() if not k.startswith("reward.")}
    return {**reward, **others}  # type: ignore[dict-item]


def _applies(setting: str, mode: str) -> bool:
    if setting.startswith("votes."):
        return mode in VOTE_READING_MODES
    return mode == "peer_pool" if setting == "surer_peers" else True


def variant_label(mode: str, settings: Mapping[str, object]) -> str:
    """``mode`` alone, or with the settings it ran with in brackets (vote settings only for a mode
    that reads votes: the others draw none; ``surer_peers`` only for ``peer_pool``)."""
    extra = {k: v for k, v in settings.items() if k != "mode" and _applies(k, mode)}
    return mode if not extra else f"{mode} [{', '.join(f'{k}={v}' for k, v in sorted(extra.items()))}]"


def _floats(row: Mapping[str, str], when: str) -> dict[str, float]:
    return {k: float(row[f"{when}_{k}"]) for k in METRICS if row.get(f"{when}_{k}", "") != ""}


def read_experiment(out: Path) -> tuple[list[MemberResult], dict[str, list[dict]]]:
    """An experiment directory's rows, relabelled by its settings, and the first seed's histories."""
    meta = json.loads((out / "experiment.json").read_text())
    settings = experiment_settings(meta)
    with (out / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    results = [
        MemberResult(
            variant_label(r["mode"], settings) if r["mode"] != "none" else "none",
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
            histories[variant_label(mode, settings)] = load_history(path)
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
