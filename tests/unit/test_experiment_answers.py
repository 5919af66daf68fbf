"""``corl experiment-answers``: each member's greedy answers before and after a run, as read and graded."""

from __future__ import annotations

from pathlib import Path

from corl.config import parse_config
from corl.experiment.answers import answers_table


def test_answers_before_and_after_come_from_the_start_and_the_final_weights(
    tiny_model_dir: Path, make_weights, tmp_path: Path
) -> None:
    after, _ = make_weights(7)
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "a").symlink_to(after)  # as a run leaves it: final/<member> -> its last version
    (run / "final" / "b").symlink_to(tiny_model_dir)
    members = [
        {"name": n, "model": str(tiny_model_dir), "servers": [f"http://127.0.0.1:{p}"]} for n, p in (("a", 1), ("b", 2))
    ]
    cfg = parse_config({"members": members, "task": {"name": "addition", "eval_size": 4}})
    table = answers_table(cfg, run, n=4)
    a, b = table.split("\nb (")
    rows_a = [r for r in a.splitlines() if r.startswith("| ") and "+" in r]
    rows_b = [r for r in b.splitlines() if r.startswith("| ") and "+" in r]
    assert len(rows_a) == len(rows_b) == 4
    # b did not change: its answers before and after are the same text; a's weights are new.
    assert all(r.split(" | ")[2] == r.split(" | ")[4] for r in rows_b)
    assert any(r.split(" | ")[2] != r.split(" | ")[4] for r in rows_a)
    assert all(("✓" in r.split(" | ")[3]) or ("✗" in r.split(" | ")[3]) for r in rows_a)
