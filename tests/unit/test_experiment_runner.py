"""The experiment runner records only finished runs: an interrupted run leaves no result.json (which
would make a resumed experiment skip it) and stops the experiment."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from corl.config import parse_config
from corl.embedded.run import RunResult
from corl.experiment import runner

MEMBERS = [{"name": n, "model": f"/m/{n}", "servers": ["http://127.0.0.1:1"]} for n in ("a", "b")]


def test_an_interrupted_run_is_not_recorded_and_stops_the_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[Path] = []

    def interrupted_run(cfg: object, run_dir: Path, opts: object, console: Console) -> RunResult:
        runs.append(run_dir)
        return RunResult(run_dir, 3, {}, run_dir / "metrics.jsonl", interrupted=True)

    monkeypatch.setattr(runner, "start_redis", lambda d: SimpleNamespace(url="redis://x", close=lambda: None))
    monkeypatch.setattr(runner, "embedded_config", lambda *a, **k: None)
    monkeypatch.setattr(runner, "run_embedded", interrupted_run)
    opts = runner.ExperimentOptions(modes=["ground_truth", "self_vote"], base=parse_config({"members": MEMBERS}))
    with pytest.raises(KeyboardInterrupt):
        runner.run_experiment(tmp_path, tmp_path / "out", opts, Console(quiet=True))
    assert [r.name for r in runs] == ["ground_truth-seed0"]  # self_vote never started
    assert not list((tmp_path / "out").rglob("result.json"))
