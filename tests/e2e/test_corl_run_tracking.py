"""``corl run`` with experiment tracking: an MLflow server that is not there stops nothing, and
TensorBoard, read back with its event accumulator, shows the whole run (every trainer's steps, the
aggregator's rounds, the supervisor's held-out readings) as one run with a series per member."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from run_processes import corl

from corl.redis_server import free_port

pytestmark = pytest.mark.slow
pytest.importorskip("tensorboard")  # the `tracking` extra (installed with `dev`)
pytest.importorskip("mlflow")


def test_an_unreachable_tracker_does_not_stop_a_run_and_tensorboard_sees_all_of_it(
    cohort: Path, tmp_path: Path
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    members = [m["name"] for m in json.loads((cohort / "cohort.json").read_text())["members"]]
    config = {
        "run_id": "tracked",
        "members": [{"name": m, "model": str(cohort / m), "servers": ["http://unassigned"]} for m in members],
        "reward": {"mode": "self_vote"},
        "tracking": {
            "report_to": ["mlflow", "tensorboard"],
            "mlflow": {"tracking_uri": f"http://127.0.0.1:{free_port()}"},  # nothing listens there
        },
    }
    (tmp_path / "cohort.yaml").write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    res = corl(
        "run",
        "--config",
        str(tmp_path / "cohort.yaml"),
        "--rounds",
        "3",
        "--out",
        str(run_dir),
        "--eval-every",
        "1000",
        cwd=tmp_path,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    failed = re.search(r"tracking failed \(the run went on without it\): \{'mlflow': (\d+)\}", res.stdout)
    assert failed and int(failed.group(1)) >= 1, res.stdout[-3000:]  # the supervisor's own failures, counted
    for log in [f"trainer-{m}" for m in members] + ["aggregator"]:
        text = (run_dir / "logs" / f"{log}.log").read_text()
        assert text.count("mlflow tracking failed") == 1, f"{log}: the failure is logged once"

    (run,) = (run_dir / "tracking" / "tensorboard").iterdir()
    assert sorted(p.name for p in run.iterdir()) == sorted(
        ["aggregator", "supervisor", *(f"trainer-{m}" for m in members)]
    )

    def scalars(process: str, tag: str) -> list[tuple[int, float]]:
        events = EventAccumulator(str(run / process))
        events.Reload()
        return [(e.step, e.value) for e in events.Scalars(tag)]

    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["members"]
    for m in members:
        assert [s for s, _ in scalars(f"trainer-{m}", f"{m}/train/mean_reward")] == [1, 2, 3]
        assert [s for s, _ in scalars("aggregator", f"{m}/round/label_rate")] == [0, 1, 2]
        readings = scalars("supervisor", f"{m}/heldout/accuracy")
        assert readings[0][0] == 0 and len(readings) >= 2  # the starting weights' reading, then the final one
        assert readings[-1][1] == pytest.approx(final[m]["accuracy"])  # what metrics.jsonl recorded last
