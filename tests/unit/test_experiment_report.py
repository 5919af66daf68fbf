"""The results table: means over seeds with standard errors, and the share of the ground-truth gain
computed per seed."""

from __future__ import annotations

from corl.experiment.report import METRICS, MemberResult, markdown_table, mean_se
from corl.rewards import collapse_round


def _result(mode: str, seed: int, before: float, after: float) -> MemberResult:
    def metrics(greedy: float) -> dict[str, float]:
        return {k: greedy for k in METRICS}

    return MemberResult(mode, seed, "m", metrics(before), metrics(after), steps=80)


def test_mean_and_standard_error_over_seeds() -> None:
    mean, se = mean_se([0.5, 0.6, 0.7])
    assert abs(mean - 0.6) < 1e-12 and se is not None and abs(se - 0.1 / 3**0.5) < 1e-12
    assert mean_se([0.4]) == (0.4, None)


def test_table_reports_standard_errors_and_per_seed_gain_shares() -> None:
    results = [
        _result("ground_truth", 0, 0.40, 0.60),
        _result("ground_truth", 1, 0.50, 0.60),
        _result("peer_pool", 0, 0.40, 0.50),  # half of seed 0's gain
        _result("peer_pool", 1, 0.50, 0.60),  # all of seed 1's gain
    ]
    table = markdown_table(results, ["ground_truth", "peer_pool"])
    assert "| reward (2 seeds)" in table
    row = next(line for line in table.splitlines() if line.startswith("| peer_pool"))
    assert "0.550 ± 0.050" in row  # greedy after: mean of 0.50 and 0.60, SE 0.05
    assert row.endswith("| 75 ± 25% (50, 100) |")  # shares 50% and 100%, then each seed
    gt_row = next(line for line in table.splitlines() if line.startswith("| ground_truth"))
    assert gt_row.endswith("| - |")  # ground truth is the reference, not a label-free mode


def test_collapse_round_finds_the_start_of_a_sustained_fall() -> None:
    rising = [(v, 0.4 + 0.01 * v) for v in range(10)]
    assert collapse_round(rising) is None
    falling = [(0, 0.45), (5, 0.50), (10, 0.48), (15, 0.40), (20, 0.52), (25, 0.44), (30, 0.38), (35, 0.30)]
    assert collapse_round(falling) == 25  # 15 recovers at 20; from 25 on it stays > 0.05 below the peak
    assert collapse_round(falling[:-2]) is None  # one point below the peak is not sustained yet


def test_diagnostics_are_the_mean_over_a_runs_snapshots_and_missing_readings_are_skipped() -> None:
    from corl.experiment.report import diagnostics_table

    def snap(label: float | None, reward: float) -> dict:
        m = {"label_rate": 0.5, "label_accuracy": label, "reward_accuracy": reward, "majority_ratio": 0.25}
        return {"members": {"a": m}}

    table = diagnostics_table({"peer_pool": [snap(None, 0.5), snap(0.4, 0.7), snap(0.8, 0.9)]})
    assert "| mode | member | prompts labelled | label accuracy | reward accuracy | majority ratio |" in table
    assert "| peer_pool | a | 0.50 | 0.60 | 0.70 | 0.25 |" in table  # label accuracy over the two readings


def test_cohort_diagnostics_average_over_snapshots_and_members() -> None:
    from corl.experiment.report import cohort_diagnostics_table

    snap = {"label_rate": 1.0, "label_accuracy": 0.5, "reward_accuracy": None, "majority_ratio": 0.4}
    rows = [
        {"members": {"a": {**snap, "distinct_answers": 4.0}, "b": {**snap, "label_accuracy": 1.0}}},
        {"members": {"a": {**snap, "label_accuracy": 0.0, "distinct_answers": 2.0}}},
    ]
    line = cohort_diagnostics_table({"peer_pool": rows}).splitlines()[2]
    assert line == "| peer_pool | 1.00 | 0.50 | - | 0.40 | 3.00 |"
