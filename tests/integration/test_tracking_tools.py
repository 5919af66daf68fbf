"""Experiment tracking read back with each tool's own reader: TensorBoard's event accumulator, W&B's
offline run files through ``wandb leet inspect``, MLflow through a real ``mlflow server`` (SQLite
store) and its client. The processes of a run (a real trainer, a real aggregator, ``corl run``'s
supervisor) report into one run with a series per member; an unreachable tracker stops nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from test_trainer_helpers import make_batches, make_config, xadd

from corl.config import CohortConfig, TrackingConfig, parse_config
from corl.health import running, wait_healthy
from corl.redis_server import free_port
from corl.services.aggregator import AggregatorSettings, create_app
from corl.services.aggregator.testing import FakeCohort
from corl.tracking import Record, build_tracking
from corl.trainer.loop import Trainer
from corl.trainer.settings import TrainerSettings

pytest.importorskip("tensorboard")  # the `tracking` extra (installed with `dev`)
pytest.importorskip("wandb")
pytest.importorskip("mlflow")

BIN = Path(sys.executable).parent


def run_config(tmp_path: Path, redis_url: str, run_id: str, **tracking: Any) -> CohortConfig:
    """Two trained members served by the aggregator tests' fake cohort, reporting as ``tracking`` says."""
    return parse_config(
        {
            "run_id": run_id,
            "redis_url": redis_url,
            "members": [{"name": n, "model": "unused", "servers": [FakeCohort.url(n)]} for n in ("a", "b")],
            "rounds": {"prompts_per_round": 4, "samples_per_prompt": 4, "max_pending_batches": 100},
            "reward": {"mode": "peer_label"},
            "tracking": {"dir": str(tmp_path / "tracking"), **tracking},
        }
    )


def steps(member: str, n: int) -> list[Record]:
    return [Record(f"{member}/train", "step", i, {"loss": 1.0 / i, "weight_version": i}) for i in range(1, n + 1)]


@pytest.fixture
def run_id() -> str:
    return "trk" + uuid.uuid4().hex[:8]


# --- TensorBoard: the real trainer and aggregator ------------------------------------------------


async def test_trainer_and_aggregator_write_one_tensorboard_run_read_by_its_event_accumulator(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, run_id: str
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracking = TrackingConfig(report_to=["tensorboard"], dir=str(tmp_path / "tracking"))
    trainer_cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id).model_copy(update={"tracking": tracking})
    client = redis.Redis.from_url(redis_url)
    for b in make_batches(tiny_model_dir, run_id, 2):
        xadd(client, b)
    trainer = Trainer(trainer_cfg, "a", TrainerSettings(consumer="c1", block_ms=50))
    trainer.setup()
    trainer.run(max_steps=2)
    trainer.close()

    agg_cfg = run_config(tmp_path, redis_url, run_id, report_to=["tensorboard"])
    settings = AggregatorSettings(config=Path("/nonexistent.yaml"), redis_url=redis_url, autostart=False)
    app = create_app(settings, config=agg_cfg, transport=FakeCohort.of("a", "b").transport())
    async with app.router.lifespan_context(app):
        for _ in range(2):
            assert (await app.state.serving.driver.run_round()).status == "ok"
    records = app.state.metrics.registry.get_sample_value("corl_tracking_records_total", {"tracker": "tensorboard"})

    (run,) = (tmp_path / "tracking" / "tensorboard").iterdir()  # one run for both processes
    assert run.name.startswith(f"{run_id}-")
    assert sorted(p.name for p in run.iterdir()) == ["aggregator", "trainer-a"]
    train = EventAccumulator(str(run / "trainer-a"))
    train.Reload()
    loss = train.Scalars("a/train/loss")
    assert [e.step for e in loss] == [1, 2]
    # The values are the trainer's own: the last one is what its Prometheus gauge shows.
    assert loss[-1].value == pytest.approx(
        trainer.metrics.registry.get_sample_value("corl_trainer_loss", {"member": "a"}), rel=1e-5
    )
    for tag in ("mean_reward", "approx_kl", "clip_fraction", "entropy", "grad_norm", "tokens_per_second"):
        assert len(train.Scalars(f"a/train/{tag}")) == 2, tag
    assert [e.value for e in train.Scalars("a/train/weight_version")] == [1.0, 2.0]
    rounds = EventAccumulator(str(run / "aggregator"))
    rounds.Reload()
    for member in ("a", "b"):
        for tag in ("label_rate", "distinct_answers", "mean_reward", "label_accuracy", "collapse_alarm"):
            assert [e.step for e in rounds.Scalars(f"{member}/round/{tag}")] == [0, 1], (member, tag)
    assert len(rounds.Scalars("cohort/round/diversity")) == 2
    assert records == 2 * 3  # the aggregator counted what it delivered: (a, b, cohort) x 2 rounds


# --- W&B offline -------------------------------------------------------------------------------------


def test_wandb_offline_runs_of_every_process_are_one_group_read_back_from_their_run_files(
    tmp_path: Path, redis_url: str, run_id: str
) -> None:
    cfg = run_config(tmp_path, redis_url, run_id, report_to=["wandb"], project="corl-test", wandb={"mode": "offline"})
    for member in ("a", "b"):
        t = build_tracking(cfg, f"trainer-{member}")
        t.log(*steps(member, 3))
        t.close()

    runs = sorted((tmp_path / "tracking" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    seen: dict[str, Any] = {}
    for run in runs:
        out = subprocess.run(
            [str(BIN / "wandb"), "leet", "inspect", "--json", str(run)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        recs = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        (header,) = [r["run"] for r in recs if r["type"] == "run"]
        history = [r["history"]["item"] for r in recs if r["type"] == "history"]
        seen[header["display_name"]] = (header, history)
    assert sorted(seen) == ["trainer-a", "trainer-b"]
    groups = {h["run_group"] for h, _ in seen.values()}
    (group,) = groups
    assert group.startswith(f"{run_id}-")  # one run key: the group that shows them as one run
    for member in ("a", "b"):
        header, history = seen[f"trainer-{member}"]
        assert header["project"] == "corl-test" and header["run_id"] == f"{group}-trainer-{member}"
        assert header["config"]["update"]["run_id"] == run_id  # the cohort config is the run's config
        assert [(h[f"{member}/train/step"], h[f"{member}/train/loss"]) for h in history] == [
            (i, pytest.approx(1.0 / i)) for i in (1, 2, 3)
        ]


# --- MLflow ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` with a SQLite store on a free loopback port."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db"]
        + ["--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
        + ["--workers", "1"],
        # Its job runner (for MLflow's own background jobs, unused here) takes ~20 s to stop.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=(root / "server.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(f"{url}/health", 120, alive=running(proc, lambda: (root / "server.log").read_text()[-3000:]))
    # MLflow sets itself up on its first call, not safely from several threads at once (seen here: a
    # KeyError on its telemetry session variable). A corl process has one MLflow thread; this test process
    # plays several processes, so it makes that first call before their threads start.
    from mlflow.tracking import MlflowClient

    MlflowClient(url).search_experiments()
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_every_process_logs_into_one_mlflow_run_read_back_with_the_mlflow_client(
    tmp_path: Path, redis_url: str, run_id: str, mlflow_server: str
) -> None:
    from mlflow.entities import RunStatus
    from mlflow.tracking import MlflowClient

    cfg = run_config(tmp_path, redis_url, run_id, report_to=["mlflow"], mlflow={"tracking_uri": mlflow_server})
    processes = {
        "trainer-a": build_tracking(cfg, "trainer-a"),
        "trainer-b": build_tracking(cfg, "trainer-b"),
        "supervisor": build_tracking(cfg, "supervisor", ends_run=True),
    }
    # All three open at once: exactly one MLflow run must come out of the race.
    processes["trainer-a"].log(*steps("a", 3))
    processes["trainer-b"].log(*steps("b", 2))
    processes["supervisor"].log(Record("a/heldout", "weight_version", 0, {"accuracy": 0.25}))
    for t in processes.values():
        t.close()

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("corl")
    (run,) = client.search_runs([experiment.experiment_id], filter_string=f"tags.`corl.run_id` = '{run_id}'")
    assert run.info.run_name.startswith(f"{run_id}-")
    assert run.info.status == RunStatus.to_string(RunStatus.FINISHED)  # ended by the supervisor
    assert run.data.params["run_id"] == run_id and run.data.params["reward.mode"] == "peer_label"
    history = client.get_metric_history(run.info.run_id, "a/train/loss")
    assert sorted((m.step, m.value) for m in history) == [(i, pytest.approx(1.0 / i)) for i in (1, 2, 3)]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "b/train/loss")] == [1, 2]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "a/heldout/accuracy")] == [0.25]


def test_an_unreachable_tracker_costs_the_caller_nothing_and_the_others_get_everything(
    tmp_path: Path, redis_url: str, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prometheus_client import CollectorRegistry
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = run_config(tmp_path, redis_url, run_id, report_to=["mlflow", "tensorboard"], mlflow={"tracking_uri": closed})
    registry = CollectorRegistry()
    t = build_tracking(cfg, "trainer-a", registry)
    t0 = time.perf_counter()
    for r in steps("a", 50):
        t.log(r)
    assert time.perf_counter() - t0 < 0.5
    deadline = time.monotonic() + 30
    while not registry.get_sample_value("corl_tracking_errors_total", {"tracker": "mlflow"}):
        assert time.monotonic() < deadline, "the failure was not counted"
        time.sleep(0.1)
    t.close()
    assert registry.get_sample_value("corl_tracking_records_total", {"tracker": "tensorboard"}) == 50
    assert registry.get_sample_value("corl_tracking_records_dropped_total", {"tracker": "mlflow"}) == 50
    (run,) = (tmp_path / "tracking" / "tensorboard").iterdir()
    events = EventAccumulator(str(run / "trainer-a"))
    events.Reload()
    assert [e.step for e in events.Scalars("a/train/loss")] == list(range(1, 51))
