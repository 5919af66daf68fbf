"""Turn per-(mode, seed, member) results into summary.csv, a markdown table and PNG plots.

Pure data handling except for the file writers at the bottom.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corl.rewards.diagnostics import collapse_round
from corl.rewards.modes import REWARD_MODES

METRICS = ("greedy_acc", "sample_acc", "maj@8_acc", "distinct", "entropy", "parsed", "formatted")
LABEL_FREE = tuple(m for m, spec in REWARD_MODES.items() if spec.label_free and m != "none")


def base_mode(label: str) -> str:
    """The reward mode of a row label: ``peer_pool [votes.samples=1]`` -> ``peer_pool``."""
    return label.split(" ", 1)[0]


@dataclass(frozen=True)
class MemberResult:
    mode: str
    seed: int
    member: str
    before: dict[str, float]
    after: dict[str, float]
    steps: int

    def row(self) -> dict[str, object]:
        out: dict[str, object] = {"mode": self.mode, "seed": self.seed, "member": self.member, "steps": self.steps}
        for k in METRICS:  # a metric a run did not measure (served readings: greedy and distinct only) is blank
            out[f"before_{k}"] = round(self.before[k], 4) if k in self.before else ""
            out[f"after_{k}"] = round(self.after[k], 4) if k in self.after else ""
        return out


def cohort_means(results: Sequence[MemberResult], metric: str, when: str = "after") -> dict[str, list[float]]:
    """mode -> cohort-mean value of ``metric`` for each seed (sorted by seed)."""
    by: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in results:
        values = r.after if when == "after" else r.before
        if metric in values:
            by[(r.mode, r.seed)].append(values[metric])
    out: dict[str, list[float]] = defaultdict(list)
    for (mode, _seed), vals in sorted(by.items(), key=lambda kv: kv[0][1]):
        out[mode].append(statistics.fmean(vals))
    return dict(out)


def gain_recovered(before: float, gt_after: float, mode_after: float) -> float | None:
    """Share of the ground-truth gain a label-free mode recovers; None when ground truth gained nothing."""
    gain = gt_after - before
    return None if gain <= 1e-9 else (mode_after - before) / gain


def mean_se(vals: Sequence[float]) -> tuple[float, float | None]:
    """Mean over seeds and its standard error (None with one seed)."""
    mean = statistics.fmean(vals)
    return mean, (statistics.stdev(vals) / len(vals) ** 0.5 if len(vals) > 1 else None)


def _fmt(vals: Sequence[float], spec: str = ".3f") -> str:
    mean, se = mean_se(vals)
    return f"{mean:{spec}}" if se is None else f"{mean:{spec}} ± {se:{spec.lstrip('+')}}"


def markdown_table(
    results: Sequence[MemberResult], modes: Sequence[str], distinct_header: str = "distinct answers / 8"
) -> str:
    """Cohort means over seeds (± standard error across seeds); the share of the ground-truth gain
    is computed per seed against that seed's ground-truth run, then averaged."""
    before = cohort_means(results, "greedy_acc", "before")
    before_vals = [v for vals in before.values() for v in vals]
    before_mean = statistics.fmean(before_vals) if before_vals else float("nan")
    greedy, distinct = cohort_means(results, "greedy_acc"), cohort_means(results, "distinct")
    maj = cohort_means(results, "maj@8_acc")
    before_distinct = cohort_means(results, "distinct", "before")
    counts = {mode: len(vals) for mode, vals in greedy.items()}
    seeds = next(iter(counts.values()), 0)
    same = len(set(counts.values())) <= 1  # else each row says how many seeds it averages
    label = f"{seeds} seed{'s' if seeds != 1 else ''}" if same else "seeds"
    lines = [
        f"| reward ({label}) | cohort mean greedy after | maj@8 after | "
        f"{distinct_header} | share of ground-truth gain |",
        "|---|---|---|---|---|",
    ]
    bd = [v for vals in before_distinct.values() for v in vals]
    lines.append(f"| before | {before_mean:.3f} | - | {statistics.fmean(bd) if bd else float('nan'):.2f} | - |")
    gt = greedy.get("ground_truth")
    for mode in modes:
        if mode not in greedy:
            continue
        share = "-"
        if base_mode(mode) in LABEL_FREE and gt is not None:
            starts = before["ground_truth"]  # every mode of a seed starts from the same cohort
            per_seed = [gain_recovered(b, g, m) for b, g, m in zip(starts, gt, greedy[mode], strict=False)]
            valid = [g for g in per_seed if g is not None]
            share = _fmt([100 * g for g in valid], ".0f") + "%" if valid else "n/a (no ground-truth gain)"
            if len(valid) > 1:
                share += " (" + ", ".join(f"{100 * g:.0f}" for g in valid) + ")"
        cells = [_fmt(greedy[mode]), _fmt(maj[mode]) if mode in maj else "-", _fmt(distinct[mode], ".2f")]
        name = mode if same else f"{mode} ({counts[mode]})"
        lines.append(f"| {name} | {' | '.join(cells)} | {share} |")
    return "\n".join(lines) + "\n"


CONTROLS = tuple(m for m, spec in REWARD_MODES.items() if spec.control)


def gains(results: Sequence[MemberResult], metric: str = "greedy_acc") -> dict[str, dict[int, float]]:
    """mode -> seed -> cohort-mean gain of ``metric`` (after minus before)."""
    by: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in results:
        if metric in r.after and metric in r.before:
            by[(r.mode, r.seed)].append(r.after[metric] - r.before[metric])
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for (mode, seed), vals in by.items():
        out[mode][seed] = statistics.fmean(vals)
    return dict(out)


def controlled_table(results: Sequence[MemberResult], modes: Sequence[str]) -> str:
    """Each mode's cohort-mean gain (± standard error over seeds), its own gain over the better control
    (the control with the larger mean gain: what a reward that knows nothing of the answers gives), that
    own gain as a share of ground truth's own gain, and the readers' parsed / formatted shares before and
    after. Empty without a control run."""
    g = gains(results)
    controls = [c for c in CONTROLS if c in g]
    if not controls:
        return ""
    best = max(controls, key=lambda c: statistics.fmean(g[c].values()))
    floor = statistics.fmean(g[best].values())
    gt_own = statistics.fmean(g["ground_truth"].values()) - floor if "ground_truth" in g else None

    def share_of(before_after: str, metric: str, mode: str) -> str:
        read = [(r.before if before_after == "before" else r.after).get(metric) for r in results if r.mode == mode]
        vals = [v for v in read if v is not None]
        return f"{statistics.fmean(vals):.2f}" if vals else "-"

    lines = [
        f"Gains over the better control (`{best}`, cohort mean {floor:+.3f}); held-out greedy accuracy:",
        "",
        "| reward | seeds | cohort gain | own gain over the control | share of ground truth's own gain "
        "| parsed before → after | formatted before → after |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        if mode not in g:
            continue
        seeds = sorted(g[mode])
        own = [g[mode][s] - floor for s in seeds]
        share = "-"
        if gt_own is not None and gt_own > 1e-9 and mode != "ground_truth":
            share = f"{100 * statistics.fmean(own) / gt_own:.0f}%"
        lines.append(
            f"| {mode} | {len(seeds)} | {_fmt(list(g[mode].values()), '+.3f')} | {_fmt(own, '+.3f')} | {share} "
            f"| {share_of('before', 'parsed', mode)} → {share_of('after', 'parsed', mode)} "
            f"| {share_of('before', 'formatted', mode)} → {share_of('after', 'formatted', mode)} |"
        )
    return "\n".join(lines) + "\n"


def write_summary_csv(results: Sequence[MemberResult], path: Path) -> None:
    rows = [r.row() for r in results]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_report(
    results: Sequence[MemberResult],
    histories: dict[str, list[dict]],
    out: Path,
    modes: Sequence[str],
    distinct_header: str = "distinct answers / 8",
) -> None:
    """summary.csv, results.md (the table, the collapse and diagnostics tables of the first seed's
    histories) and the curves into ``out``."""
    if not results:
        return
    write_summary_csv(results, out / "summary.csv")
    seed = results[0].seed
    collapse = f"\nSustained falls (seed {seed}):\n\n{collapse_table(histories)}" if histories else ""
    diagnostics = (
        f"\nDiagnostics (seed {seed}, mean over the run's snapshots and members):\n\n"
        f"{cohort_diagnostics_table(histories)}"
        f"\nPer member:\n\n{diagnostics_table(histories)}"
        if histories
        else ""
    )
    controlled = controlled_table(results, modes)
    controlled = f"\n{controlled}" if controlled else ""
    (out / "results.md").write_text(
        markdown_table(results, modes, distinct_header) + controlled + collapse + diagnostics
    )
    if histories:
        plot_curves(histories, out)


def member_series(history: Sequence[dict], key: str) -> dict[str, list[tuple[int, float]]]:
    """member -> (weight version, value) points of one snapshot field, one per version, in order
    (held-out accuracy is placed at the version it was measured on)."""
    series: dict[str, dict[int, float]] = defaultdict(dict)
    for row in history:
        for member, m in row["members"].items():
            x = m.get("accuracy_version") if key == "accuracy" else m.get("weight_version")
            if x is not None and m.get(key) is not None:
                series[member][int(x)] = float(m[key])
    return {member: sorted(pts.items()) for member, pts in series.items()}


def collapse_table(histories: dict[str, list[dict]]) -> str:
    """Per mode and member, the version where held-out accuracy and distinct answers start a
    sustained fall (``corl.rewards.collapse_round``); '-' when they never do."""
    lines = ["| mode | member | accuracy falls from | distinct answers fall from |", "|---|---|---|---|"]
    for mode in sorted(histories):
        acc, distinct = member_series(histories[mode], "accuracy"), member_series(histories[mode], "distinct_answers")
        for member in sorted(acc):
            a, d = collapse_round(acc.get(member, [])), collapse_round(distinct.get(member, []), drop=0.5)
            lines.append(f"| {mode} | {member} | {'-' if a is None else f'v{a}'} | {'-' if d is None else f'v{d}'} |")
    return "\n".join(lines) + "\n"


DIAGNOSTICS = (
    ("label_rate", "prompts labelled"),
    ("label_accuracy", "label accuracy"),
    ("reward_accuracy", "reward accuracy"),
    ("majority_ratio", "majority ratio"),
)


def diagnostics_table(histories: dict[str, list[dict]]) -> str:
    """TTRL's diagnostics per mode and member, the mean over a run's snapshots: how many prompts got
    a supervision label, how often that label was the data set's answer, how often a sample's reward
    said whether it was right, and the share of a member's samples that give its own plurality
    answer. The data set's answers only ever reach these logs, never a reward."""
    head = " | ".join(title for _, title in DIAGNOSTICS)
    lines = [f"| mode | member | {head} |", "|---|---|" + "---|" * len(DIAGNOSTICS)]
    for mode in sorted(histories):
        members = sorted({m for row in histories[mode] for m in row["members"]})
        for member in members:
            rows = [row["members"][member] for row in histories[mode] if member in row["members"]]
            cells = []
            for key, _ in DIAGNOSTICS:
                vals = [r[key] for r in rows if r.get(key) is not None]
                cells.append(f"{statistics.fmean(vals):.2f}" if vals else "-")
            lines.append(f"| {mode} | {member} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def cohort_diagnostics_table(histories: dict[str, list[dict]]) -> str:
    """The same diagnostics per mode, averaged over the members too, with the distinct answers per G
    while training: one row per mode, for comparing modes at a glance."""
    keys = [*DIAGNOSTICS, ("distinct_answers", "distinct answers (training)")]
    lines = [f"| mode | {' | '.join(t for _, t in keys)} |", "|---|" + "---|" * len(keys)]
    for mode, history in histories.items():
        cells = []
        for key, _ in keys:
            vals = [m[key] for row in history for m in row["members"].values() if m.get(key) is not None]
            cells.append(f"{statistics.fmean(vals):.2f}" if vals else "-")
        lines.append(f"| {mode} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def load_history(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


PLOT_COLUMNS = 4  # modes per row of a figure


def plot_curves(histories: dict[str, list[dict]], out_dir: Path) -> list[Path]:
    """One PNG for held-out accuracy and one for diversity over training, a line per member and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for key, ylabel, fname in (
        ("accuracy", "held-out greedy accuracy", "accuracy.png"),
        ("distinct_answers", "distinct answers per G samples", "diversity.png"),
        ("label_accuracy", "supervision-label accuracy (diagnostic)", "label_accuracy.png"),
        ("reward_accuracy", "reward accuracy (diagnostic)", "reward_accuracy.png"),
        ("majority_ratio", "majority ratio", "majority_ratio.png"),
    ):
        if not any(m.get(key) is not None for rows in histories.values() for r in rows for m in r["members"].values()):
            continue  # a history recorded before this diagnostic existed
        modes = sorted(histories)
        cols = min(len(modes), PLOT_COLUMNS)
        rows = -(-len(modes) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False, sharey=True)
        for i, ax in enumerate(axes.flat):
            if i >= len(modes):
                ax.set_visible(False)
                continue
            for member, pts in sorted(member_series(histories[modes[i]], key).items()):
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=2, label=member)
            ax.set_title(modes[i], fontsize=7)
            ax.set_xlabel("weight version (training steps)")
            ax.grid(alpha=0.3)
        for row in axes:
            row[0].set_ylabel(ylabel)
        axes[0][-1].legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
