"""``corl run --resume``: a run stopped with SIGTERM, or killed with its whole process tree (kill -9),
goes on from its run directory to the rounds first asked: every trainer applies each round's batch
exactly once, weight versions keep rising, and the metrics and held-out history continue."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
from run_processes import corl, leftovers, published_versions, run_state, start_run

from corl import redis_keys
from corl.redis_server import LocalRedis
from corl.services.aggregator.batches import batch_id
from corl.streams import group_backlog
from corl.trainer.checkpoint import Checkpointer

pytestmark = pytest.mark.slow

ROUNDS, STOP_AT = 8, 3  # back-pressure lets the aggregator run up to 2 rounds ahead of its trainers
RUN_ID = "embedded"  # the run id of a run started without --config


def committed_rounds(run_dir: Path) -> int:
    """The aggregator's durable round counter, read from the run's own Redis."""
    return run_state(run_dir, redis_keys.round_state(RUN_ID), "next_round")


def stop_at_round(proc: subprocess.Popen[str], run_dir: Path, how: str) -> None:
    deadline = time.monotonic() + 240
    while committed_rounds(run_dir) < STOP_AT:
        assert proc.poll() is None and time.monotonic() < deadline, "the run never reached the round to stop at"
        time.sleep(0.1)
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:  # the supervisor, Redis, servers, aggregator and trainers at once: nothing gets to clean up
        for p in leftovers(run_dir):
            try:
                os.kill(p["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.communicate(timeout=120)


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_a_stopped_run_resumes_to_the_rounds_asked(cohort: Path, tmp_path: Path, how: str) -> None:
    run_dir = tmp_path / "run"
    proc = start_run(cohort, run_dir, ROUNDS, "--eval-every", "2")
    stop_at_round(proc, run_dir, how)
    assert leftovers(run_dir, cohort) == [], "processes left behind by the stop"
    rows_before = len((run_dir / "metrics.jsonl").read_text().splitlines())

    res = corl("run", "--resume", str(run_dir), "--eval-every", "2", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = rf"resuming run {RUN_ID} at round (\d+) of {ROUNDS}, versions: gpt2 v\d+, llama v\d+"
    resumed = re.search(line, res.stdout)
    assert resumed, res.stdout[-3000:]
    assert STOP_AT <= int(resumed.group(1)) < ROUNDS, "stopped after the last round: nothing was resumed"

    # Metrics appended: one history, its clock, rounds and every member's weight version never going back.
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(history) > rows_before and history[-1]["rounds"] == ROUNDS
    for key in ("elapsed_s", "rounds"):
        assert [r[key] for r in history] == sorted(r[key] for r in history), key
    members = [m["name"] for m in json.loads((cohort / "cohort.json").read_text())["members"]]
    for m in members:
        served = [r["members"][m]["weight_version"] for r in history if r["members"][m]["weight_version"] is not None]
        assert served == sorted(served), f"{m}: served versions went back: {served}"
        # Held-out history: read once at version 0 when the run started, then only at newer versions.
        readings = [r["members"][m]["accuracy_version"] for r in history]
        assert readings[0] == 0 and readings == sorted(readings), f"{m}: held-out readings {readings}"
        assert readings[-1] == served[-1] > 0

        # Each round's batch applied exactly once, in round order, in the lineage that survived.
        state = Checkpointer.load_state(Checkpointer(run_dir / "checkpoints", m).latest())  # type: ignore[arg-type]
        assert state.applied == [batch_id(RUN_ID, r, m) for r in range(ROUNDS)]
        assert state.step == ROUNDS
        # Versions rise across the stop: none reused, none lower than one published before.
        versions = published_versions(run_dir / "logs" / f"trainer-{m}.log", m)
        assert versions == sorted(set(versions)) and versions[-1] == state.weight_version == served[-1], versions

    # The run's Redis (replayed from its append-only file) agrees: every round committed, every batch
    # acknowledged and recorded as applied.
    with LocalRedis(data_dir=run_dir / "redis") as server:
        client = redis.Redis.from_url(server.url)
        assert int(client.hget(redis_keys.round_state(RUN_ID), "next_round") or 0) == ROUNDS
        for m in members:
            applied = {x.decode() for x in client.smembers(redis_keys.trainer_applied(RUN_ID, m))}
            assert applied == {batch_id(RUN_ID, r, m) for r in range(ROUNDS)}
            assert group_backlog(client, redis_keys.batches_stream(RUN_ID, m), redis_keys.TRAINER_GROUP) == (0, 0)
        client.close()
    assert leftovers(run_dir, cohort) == [], "processes left behind"
