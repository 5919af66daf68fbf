"""Experiment tracking without the trackers' libraries: the fan-out never lets a tracker stop or slow
the caller, failures are logged once and counted, the config section and the records processes send."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from corl.config import ConfigError, TrackerUnavailable, TrackingConfig, load_config, parse_config
from corl.proto import MemberRoundStats, RoundStats
from corl.services.aggregator.stats import round_records
from corl.tracking import Record
from corl.tracking.identity import run_key
from corl.tracking.metrics import TrackingMetrics
from corl.tracking.worker import TrackerWorker, Tracking
from corl.trainer.policy import StepStats

FAST = (0.01, 0.05)  # back-off of the failing trackers here


class Collecting:
    def __init__(self, name: str = "good") -> None:
        self.name, self.got, self.closed = name, [], ""

    def open(self) -> None:
        pass

    def log(self, records: Sequence[Record]) -> None:
        self.got.extend(records)

    def close(self, outcome: str) -> None:
        self.closed = outcome


class Failing(Collecting):
    """Fails its first ``failures`` calls (every call when None), like a tracker whose server is down."""

    def __init__(self, failures: int | None = None) -> None:
        super().__init__("broken")
        self.failures, self.calls = failures, 0

    def open(self) -> None:
        self.calls += 1
        if self.failures is None or self.calls <= self.failures:
            raise ConnectionError("connection refused")


class Hanging(Collecting):
    def __init__(self) -> None:
        super().__init__("hanging")
        self.release = threading.Event()

    def log(self, records: Sequence[Record]) -> None:
        self.release.wait()


def tracking(
    *trackers: Collecting, queue_size: int = 1000, close_timeout_s: float = 5.0
) -> tuple[Tracking, TrackingMetrics]:
    """The trackers on workers; a ``Hanging`` one gets a queue of ``queue_size``, the others 1000."""
    metrics = TrackingMetrics(trackers=[t.name for t in trackers])
    sizes = [queue_size if isinstance(x, Hanging) else 1000 for x in trackers]
    workers = [TrackerWorker(x, metrics, n, FAST) for x, n in zip(trackers, sizes, strict=True)]
    return Tracking(workers, close_timeout_s), metrics


def count(metrics: TrackingMetrics, name: str, tracker: str) -> float:
    return metrics.registry.get_sample_value(f"corl_tracking_{name}_total", {"tracker": tracker}) or 0.0


def step(i: int) -> Record:
    return Record("a/train", "step", i, {"loss": 1.0 / i})


def test_a_failing_tracker_is_counted_logged_once_and_never_reaches_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good, broken = Collecting(), Failing()
    t, m = tracking(broken, good)
    with caplog.at_level(logging.WARNING, logger="corl.tracking.worker"):
        for i in range(1, 51):
            t.log(step(i))  # never raises
            time.sleep(0.002)
        t.close()
    assert [r.step for r in good.got] == list(range(1, 51)) and good.closed == "finished"
    assert broken.calls >= 2 and count(m, "errors", "broken") == broken.calls
    assert count(m, "records", "good") == 50 and count(m, "errors", "good") == 0
    assert t.errors() == {"broken": broken.calls}
    warnings = [r for r in caplog.records if "broken tracking failed" in r.getMessage()]
    assert len(warnings) == 1 and "ConnectionError" in warnings[0].getMessage()


def test_a_tracker_that_recovers_gets_the_records_after_its_outage(caplog: pytest.LogCaptureFixture) -> None:
    flaky = Failing(failures=2)
    t, m = tracking(flaky)
    with caplog.at_level(logging.INFO, logger="corl.tracking.worker"):
        for i in range(1, 4):
            t.log(step(i))
            time.sleep(0.1)  # past the back-off: each record is a call of its own
        t.close()
    assert [r.step for r in flaky.got] == [3]
    assert count(m, "errors", "broken") == 2 and count(m, "records_dropped", "broken") == 2
    assert any("works again" in r.getMessage() for r in caplog.records)


def test_a_hanging_tracker_neither_blocks_the_caller_nor_the_others_and_overflow_is_counted() -> None:
    hanging, good = Hanging(), Collecting()
    t, m = tracking(hanging, good, queue_size=10, close_timeout_s=0.5)
    t0 = time.perf_counter()
    for i in range(1, 201):
        t.log(step(i))
    assert time.perf_counter() - t0 < 0.5, "logging waited for a tracker"
    time.sleep(0.3)
    assert len(good.got) == 200
    # At most one batch is stuck in the hanging call and 10 wait in its queue: the rest were dropped, counted.
    assert count(m, "records_dropped", "hanging") >= 200 - 2 * 10
    t0 = time.perf_counter()
    t.close()
    assert time.perf_counter() - t0 < 2.0, "close waited past its timeout"
    hanging.release.set()


def test_no_trackers_configured_means_no_threads() -> None:
    before = threading.active_count()
    t = Tracking()
    t.log(step(1))
    t.close()
    assert not t.enabled and threading.active_count() == before


def test_the_tracking_section_parses_resolves_its_folder_and_refuses_a_tracker_named_twice(tmp_path: Path) -> None:
    base = {"members": [{"name": n, "model": "m", "servers": ["http://h:1"]} for n in ("a", "b")]}
    path = tmp_path / "cohort.yaml"
    path.write_text(yaml.safe_dump({**base, "tracking": {"report_to": ["tensorboard"], "dir": "tb"}}))
    cfg = load_config(path)
    assert cfg.tracking.report_to == ["tensorboard"] and cfg.tracking.dir == str(tmp_path / "tb")
    assert parse_config(base).tracking.report_to == []  # off by default
    with pytest.raises(ConfigError, match="named twice"):
        parse_config({**base, "tracking": {"report_to": ["wandb", "wandb"]}})
    with pytest.raises(ConfigError, match="tracking.report_to"):
        parse_config({**base, "tracking": {"report_to": ["neptune"]}})


def test_a_tracker_that_cannot_be_used_is_refused_when_the_process_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = TrackingConfig(report_to=["mlflow"])  # reading the config is fine
    with pytest.raises(TrackerUnavailable, match=r"\['mlflow'\].*pip install 'corl\[tracking\]'"):
        cfg.check_usable()
    monkeypatch.setattr(importlib.util, "find_spec", real)
    with pytest.raises(TrackerUnavailable, match="MLFLOW_TRACKING_URI"):
        cfg.check_usable()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    cfg.check_usable()
    with pytest.raises(TrackerUnavailable, match="WANDB_API_KEY"):
        TrackingConfig(report_to=["wandb"]).check_usable()
    TrackingConfig(report_to=["wandb"], wandb={"mode": "offline"}).check_usable()


def test_round_records_carry_every_member_figure_the_alarm_and_the_cohort(
    member_stats: Callable[..., MemberRoundStats],
) -> None:
    member = member_stats(label_rate=0.75, label_accuracy=0.25)
    stats = RoundStats(
        round=7, created_at=0.0, members={"a": member, "b": member}, missing=["c"], agreement={}, cohort_diversity=0.5
    )
    a, b, cohort = round_records(stats, {"a": True})
    assert (a.section, a.axis, a.step) == ("a/round", "round", 7)
    assert dict(a.items())["a/round/label_rate"] == 0.75 and a.values["collapse_alarm"] == 1.0
    assert b.values["collapse_alarm"] == 0.0 and "pseudo_label_accuracy" not in b.values  # None: not sent
    assert dict(cohort.items()) == {"cohort/round/diversity": 0.5, "cohort/round/members_missing": 1.0}


def test_step_stats_report_the_update_only_when_there_was_one() -> None:
    stats = StepStats(0.1, 0.5, 0.3, 0.02, 0.01, None, 1.2, 0.9, 2.0, 400, 16, 1)
    assert stats.reported() == {
        "mean_reward": 0.5,
        "groups_skipped": 1.0,
        "loss": 0.1,
        "approx_kl": 0.01,
        "clip_fraction": 0.02,
        "entropy": 1.2,
        "grad_norm": 0.9,
        "advantage_std": 0.3,
        "tokens_per_second": 200.0,
        "step_seconds": 2.0,
    }
    idle = StepStats(0.0, 1.0, 0.0, 0.0, 0.0, None, 0.0, 0.0, 0.1, 0, 0, 4)
    assert idle.reported() == {"mean_reward": 1.0, "groups_skipped": 4.0}


def test_run_keys_are_safe_names_that_sort_by_start() -> None:
    assert run_key("my run/1", 0.0) == "my-run-1-19700101-000000"
    assert run_key("tiny", 86400.0) > run_key("tiny", 0.0)
