"""``corl run --resume``: what a resume refuses (a config change the run cannot follow, named), what
it allows, and the history it goes on from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corl.cli import app
from corl.config import CohortConfig, dump_config, parse_config
from corl.embedded import processes
from corl.embedded.progress import MemberSnapshot, MetricsHistory, RoundLog, RunSnapshot
from corl.embedded.resume import ResumeRefused, check_resumable, config_changes
from corl.proto import RoundStats

MEMBERS = [{"name": n, "model": f"/m/{n}", "servers": ["http://127.0.0.1:1"]} for n in ("a", "b")]


def config(**changes: object) -> CohortConfig:
    data: dict = {"run_id": "r1", "members": MEMBERS, "reward": {"mode": "self_vote"}, "rounds": {"max_rounds": 6}}
    data["redis_url"] = "redis://127.0.0.1:1/0"  # where no Redis answers: the run is not running
    return parse_config({**data, **changes})


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"members": [MEMBERS[0], {**MEMBERS[1], "name": "c"}]}, ["members removed: b", "members added: c"]),
        ({"members": [MEMBERS[0], {**MEMBERS[1], "model": "/m/other"}]}, ["member b model: /m/b -> /m/other"]),
        ({"members": [MEMBERS[0], {**MEMBERS[1], "role": "frozen"}]}, ["member b role: trained -> frozen"]),
        ({"members": [MEMBERS[0], {**MEMBERS[1], "trainer_processes": 2}]}, ["member b trainer_processes: 1 -> 2"]),
        ({"task": {"name": "math", "source": "packaged:gsm8k"}}, ["task.name: addition -> math", "task.source"]),
        ({"reward": {"mode": "peer_label"}}, ["reward.mode: self_vote -> peer_label"]),
        ({"run_id": "r2"}, ["run_id: r1 -> r2"]),
        ({"training": {"lora": {}}}, ["training.lora: turned on"]),
        ({"rounds": {"max_rounds": 6, "prompt_source": {"seed": 3}}}, ["rounds.prompt_source.seed: 0 -> 3"]),
    ],
)
def test_a_change_the_run_cannot_follow_is_refused_and_named(changes: dict, named: list[str]) -> None:
    found = config_changes(config(), config(**changes))
    assert len(found) == len(named) and all(f.startswith(n) for f, n in zip(found, named, strict=True)), found
    with pytest.raises(ResumeRefused) as refused:
        check_resumable(Path("runs/x"), config(), config(**changes))
    assert all(n in str(refused.value) for n in named) and "cannot resume runs/x" in str(refused.value)


def test_rounds_evaluation_and_training_settings_may_change() -> None:
    later = config(rounds={"max_rounds": 80, "prompts_per_round": 4}, training={"lr": 1e-4, "checkpoint_every": 2})
    assert config_changes(config(), later) == []
    check_resumable(Path("runs/x"), config(), later)


@pytest.fixture
def stored_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory holding the config its run started with (as ``corl run`` writes it)."""
    monkeypatch.setattr(processes, "exit_on_sigterm", lambda: None)  # the CLI's handlers stay out of pytest
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dump_config(config(), run_dir / "cohort.yaml")
    return run_dir


def test_corl_run_refuses_to_resume_with_another_reward_mode_and_starts_nothing(stored_run: Path) -> None:
    res = CliRunner().invoke(app, ["run", "--resume", str(stored_run), "--reward", "peer_label"])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())  # rich wraps lines to the terminal's width
    assert "cannot resume" in text and "reward.mode: self_vote -> peer_label" in text
    assert not (stored_run / "redis").exists() and not (stored_run / "logs").exists()


def test_corl_run_will_not_start_a_second_run_over_one_nor_resume_an_empty_directory(
    stored_run: Path, tmp_path: Path
) -> None:
    over = CliRunner().invoke(app, ["run", "--out", str(stored_run)])
    assert over.exit_code == 2 and "--resume" in " ".join(over.output.split()), over.output
    empty = CliRunner().invoke(app, ["run", "--resume", str(tmp_path / "nothing")])
    assert empty.exit_code == 2 and "no run to resume" in " ".join(empty.output.split()), empty.output
    assert not (stored_run / "redis").exists()


def test_the_history_goes_on_from_its_last_complete_snapshot(tmp_path: Path) -> None:
    history = MetricsHistory(tmp_path / "metrics.jsonl")
    assert history.last() is None
    snap = RunSnapshot(elapsed_s=12.5, rounds=3, members={"a": MemberSnapshot(weight_version=3, accuracy=0.5)})
    history.append(snap)
    with history.path.open("a") as f:
        f.write('{"time": 1.0, "elapsed_s": 14.0, "rou')  # the row a kill -9 cut short
    assert history.last() == snap
    history.append(RunSnapshot(elapsed_s=20.0, rounds=4))
    rows = [json.loads(line) for line in history.path.read_text().splitlines()]  # every line whole again
    assert [r["rounds"] for r in rows] == [3, 4]


def test_the_round_log_keeps_every_round_once_across_a_resume(tmp_path: Path) -> None:
    def stats(r: int) -> RoundStats:
        return RoundStats(round=r, created_at=float(r), members={}, missing=[], agreement={}, cohort_diversity=0.0)

    log = RoundLog(tmp_path / "rounds.jsonl")
    log.extend([stats(0), stats(1)])
    log.extend([stats(1), stats(2)])  # the next poll reads round 1 again
    with log.path.open("a") as f:
        f.write('{"round": 3, "crea')  # the line a kill -9 cut short
    resumed = RoundLog(log.path)
    resumed.extend([stats(2), stats(3)])
    assert [json.loads(line)["round"] for line in log.path.read_text().splitlines()] == [0, 1, 2, 3]


def test_a_snapshot_row_from_another_version_still_restores() -> None:
    row = {"elapsed_s": 3.0, "rounds": 2, "members": {"a": {"weight_version": 2, "a_field_of_later_days": 1}}}
    assert RunSnapshot.from_row(row) == RunSnapshot(3.0, 2, {"a": MemberSnapshot(weight_version=2)})
