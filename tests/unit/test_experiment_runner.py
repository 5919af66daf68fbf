"""The experiment runner records only finished runs: an interrupted run leaves no result.json (which
would make a resumed experiment skip it) and stops the experiment."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from corl.config import parse_config
from corl.embedded.run import RunResult
from corl.experiment import report, runner

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


@pytest.fixture
def finished_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict | None]]:
    """Runs that finish at once: (run directory name, start readings it was given), in order. The
    first run reads a=0.25, b=0.5 at version 0; every run ends at 0.75 at version 4."""
    import json

    from corl.embedded.progress import MemberSnapshot

    runs: list[tuple[str, dict | None]] = []

    def finished_run(cfg: object, run_dir: Path, opts: runner.RunOptions, console: Console) -> RunResult:
        given = None if opts.start_accuracy is None else {m: r.accuracy for m, r in opts.start_accuracy.items()}
        runs.append((run_dir.name, given))
        run_dir.mkdir(parents=True, exist_ok=True)
        start = given or {"a": 0.25, "b": 0.5}  # what the servers read in the first run
        rows = [
            {"members": {m: {"accuracy": start[m], "accuracy_version": 0, "distinct_answers": 2.0} for m in "ab"}},
            {"members": {m: {"accuracy": 0.75, "accuracy_version": 4, "distinct_answers": 1.0} for m in "ab"}},
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        final = {m: MemberSnapshot(weight_version=4) for m in "ab"}
        return RunResult(run_dir, 4, final, run_dir / "metrics.jsonl")

    monkeypatch.setattr(runner, "start_redis", lambda d: SimpleNamespace(url="redis://x", close=lambda: None))
    monkeypatch.setattr(runner, "embedded_config", lambda *a, **k: None)
    monkeypatch.setattr(runner, "run_embedded", finished_run)
    monkeypatch.setattr(report, "plot_curves", lambda *a, **k: None)
    return runs


def test_later_runs_take_the_first_runs_start_reading_and_a_resumed_experiment_too(
    tmp_path: Path, finished_runs: list[tuple[str, dict | None]]
) -> None:
    """The starting cohort, held-out problems and greedy decoding are the same in every run of an
    experiment: the first run reads them through its servers, the others record that reading."""
    base = parse_config({"members": MEMBERS})
    out = tmp_path / "out"
    runner.run_experiment(
        tmp_path, out, runner.ExperimentOptions(modes=["ground_truth"], base=base), Console(quiet=True)
    )
    opts = runner.ExperimentOptions(modes=["ground_truth", "self_vote"], seeds=[0, 1], base=base)
    results = runner.run_experiment(tmp_path, out, opts, Console(quiet=True))  # resumed: ground_truth seed 0 done
    assert [given for _, given in finished_runs] == [None] + [{"a": 0.25, "b": 0.5}] * 3
    assert {(r.mode, r.seed, r.member, r.before["greedy_acc"]) for r in results} == {
        (mode, seed, m, acc)
        for mode in ("ground_truth", "self_vote")
        for seed in (0, 1)
        for m, acc in (("a", 0.25), ("b", 0.5))
    }


def test_a_mode_limited_to_fewer_seeds_runs_only_its_first_ones_and_the_table_says_so(
    tmp_path: Path, finished_runs: list[tuple[str, dict | None]]
) -> None:
    from corl.cli.experiment import parse_modes

    modes, limits = parse_modes("ground_truth, self_vote:1")
    assert (modes, limits) == (["ground_truth", "self_vote"], {"self_vote": 1})
    opts = runner.ExperimentOptions(
        modes=modes, seeds=[3, 4, 5], seed_limits=limits, base=parse_config({"members": MEMBERS})
    )
    runner.run_experiment(tmp_path, tmp_path / "out", opts, Console(quiet=True))
    assert [name for name, _ in finished_runs] == [
        "ground_truth-seed3",
        "self_vote-seed3",
        "ground_truth-seed4",
        "ground_truth-seed5",
    ]
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| ground_truth (3) |" in table and "| self_vote (1) |" in table


def test_the_experiment_records_the_reward_settings_its_runs_shared_from_the_config_and_the_overrides(
    tmp_path: Path, finished_runs: list[tuple[str, dict | None]]
) -> None:
    base = parse_config({"members": MEMBERS, "reward": {"votes": {"samples": 8, "temperature": 0.5}}})
    overrides = {"reward.votes.temperature": 0.7, "reward.threshold": 0.5, "training.lr": 1e-5}
    opts = runner.ExperimentOptions(modes=["ground_truth"], base=base, overrides=overrides)
    runner.run_experiment(tmp_path, tmp_path / "out", opts, Console(quiet=True))
    meta = json.loads((tmp_path / "out" / "experiment.json").read_text())
    assert meta["reward"] == {"threshold": 0.5, "votes.samples": 8, "votes.temperature": 0.7}
    assert meta["overrides"] == overrides


@pytest.mark.parametrize("spec", ["self_vote:0", "self_vote:x", "self_vote:"])
def test_a_bad_seed_limit_is_refused(spec: str) -> None:
    import typer

    from corl.cli.experiment import parse_modes

    with pytest.raises(typer.BadParameter, match="MODE:N"):
        parse_modes(spec)


def _runs_writing_their_config(monkeypatch: pytest.MonkeyPatch, interrupt: str = "") -> list[tuple[str, bool]]:
    """Runs that write their config into their directory, as a started run does, then either finish
    (a result) or, for the run named ``interrupt``, stop early; (run directory name, resumed) in order."""
    from corl.config import dump_config
    from corl.embedded.progress import MemberSnapshot

    runs: list[tuple[str, bool]] = []

    def run(cfg: object, run_dir: Path, opts: runner.RunOptions, console: Console) -> RunResult:
        runs.append((run_dir.name, opts.resume))
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, run_dir / "cohort.yaml")  # type: ignore[arg-type]
        row = {"members": {m: {"accuracy": 0.5, "accuracy_version": 0} for m in "ab"}}
        (run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        final = {m: MemberSnapshot(weight_version=2) for m in "ab"}
        return RunResult(run_dir, 2, final, run_dir / "metrics.jsonl", interrupted=run_dir.name == interrupt)

    monkeypatch.setattr(
        runner, "start_redis", lambda d: SimpleNamespace(url="redis://127.0.0.1:1/0", close=lambda: None)
    )
    monkeypatch.setattr(runner, "run_embedded", run)
    monkeypatch.setattr(report, "plot_curves", lambda *a, **k: None)
    return runs


def test_a_run_stopped_before_its_end_is_resumed_by_the_next_invocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = runner.ExperimentOptions(modes=["ground_truth", "self_vote"], base=parse_config({"members": MEMBERS}))
    runs = _runs_writing_their_config(monkeypatch, interrupt="self_vote-seed0")
    with pytest.raises(KeyboardInterrupt):
        runner.run_experiment(tmp_path, tmp_path / "out", opts, Console(quiet=True))
    runs = _runs_writing_their_config(monkeypatch)
    results = runner.run_experiment(tmp_path, tmp_path / "out", opts, Console(quiet=True))
    assert runs == [("self_vote-seed0", True)]  # ground_truth finished: not run again
    assert {(r.mode, r.member) for r in results} == {(m, n) for m in ("ground_truth", "self_vote") for n in "ab"}


def test_a_stopped_run_is_not_resumed_under_other_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corl.embedded.resume import ResumeRefused

    opts = runner.ExperimentOptions(modes=["ground_truth"], base=parse_config({"members": MEMBERS}))
    _runs_writing_their_config(monkeypatch, interrupt="ground_truth-seed0")
    with pytest.raises(KeyboardInterrupt):
        runner.run_experiment(tmp_path, tmp_path / "out", opts, Console(quiet=True))
    other = [MEMBERS[0], {**MEMBERS[1], "model": "/m/other"}]
    opts = runner.ExperimentOptions(modes=["ground_truth"], base=parse_config({"members": other}))
    runs = _runs_writing_their_config(monkeypatch)
    with pytest.raises(ResumeRefused, match="member b model: /m/b -> /m/other"):
        runner.run_experiment(tmp_path, tmp_path / "out", opts, Console(quiet=True))
    assert runs == []
