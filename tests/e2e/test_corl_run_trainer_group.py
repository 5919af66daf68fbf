"""``corl run`` with one member trained by a 2-process group (``trainer_processes: 2``, FSDP2 on gloo):
the group trains, publishes and its server swaps; rank 1 killed with SIGKILL mid-run takes the group
down, the run's restart policy starts it again, and the run ends with every round's batch applied
exactly once by that member, its versions rising."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import redis
import yaml
from run_processes import leftovers, published_versions, run_state

from corl import redis_keys
from corl.embedded.config import cohort_members
from corl.embedded.processes import corl_command
from corl.redis_server import LocalRedis
from corl.services.aggregator.batches import batch_id
from corl.trainer.checkpoint import Checkpointer, is_sharded_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

ROUNDS = 8
GROUP = "gpt2"  # the member trained by a group; the others train in one process each


def group_rank(member: str, rank: int) -> psutil.Process | None:
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "train" in cmd and member in cmd and "torch.distributed.run" not in cmd:
            try:
                if p.environ().get("RANK") == str(rank):
                    return p
            except psutil.Error:
                continue
    return None


def published(run_dir: Path, member: str) -> int:
    return run_state(run_dir, redis_keys.trainer_state("group", member), "published_version")


def test_a_trainer_group_trains_swaps_and_survives_a_killed_rank(cohort: Path, tmp_path: Path) -> None:
    members = [
        {"name": n, "model": str(cohort / n), "servers": ["http://unassigned"]}
        | ({"trainer_processes": 2} if n == GROUP else {})
        for n in cohort_members(cohort)
    ]
    config = tmp_path / "group.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run_id": "group",
                "members": members,
                "reward": {"mode": "self_vote"},
                "training": {"checkpoint_every": 2, "distributed": {"strategy": "fsdp2"}},
            }
        )
    )
    run_dir = tmp_path / "run"
    cmd = corl_command("run", "--config", str(config), "--rounds", str(ROUNDS), "--out", str(run_dir))
    proc = subprocess.Popen(
        [*cmd, "--restart", "on-failure:2", "--eval-every", "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not ((run_dir / "cohort.yaml").exists() and published(run_dir, GROUP) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.2)
    rank1 = group_rank(GROUP, 1)
    assert rank1 is not None, "no rank 1 of the trainer group"
    rank1.kill()
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    assert "restarted under on-failure: {'trainer-gpt2': 1}" in out, out[-3000:]

    state_dir = Checkpointer(run_dir / "checkpoints", GROUP).latest()
    assert state_dir is not None and is_sharded_checkpoint(state_dir)
    state = Checkpointer.load_state(state_dir)
    assert state.applied == [batch_id("group", r, GROUP) for r in range(ROUNDS)]  # no gap, no repeat
    assert state.step == ROUNDS
    versions = published_versions(run_dir / "logs" / f"trainer-{GROUP}.log", GROUP)
    assert versions == sorted(set(versions)) and versions[-1] == state.weight_version
    # The server swapped to the group's newest version.
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert history[-1]["members"][GROUP]["weight_version"] == state.weight_version > 0
    with LocalRedis(data_dir=run_dir / "redis") as server:
        client = redis.Redis.from_url(server.url)
        applied = {x.decode() for x in client.smembers(redis_keys.trainer_applied("group", GROUP))}
        assert applied == {batch_id("group", r, GROUP) for r in range(ROUNDS)}
        client.close()
    assert leftovers(run_dir, cohort) == [], "processes left behind"
