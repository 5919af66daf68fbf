"""A member's trainer group (``torchrun``, 2 ranks, gloo) keeps the single-process guarantees: killed
with SIGKILL on rank 1 mid-run, the group stops; started again it resumes from its sharded
checkpoint (torch.distributed.checkpoint) and applies every batch exactly once, with versions never
reused. Stopped with SIGTERM, it checkpoints, and a new group resumes at the same step."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from test_trainer_helpers import applied_ids, make_batches, make_config, published_version, start_trainer, xadd

from corl import redis_keys
from corl.config import dump_config
from corl.embedded.processes import trainer_group_command
from corl.trainer.checkpoint import Checkpointer, is_sharded_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

N_BATCHES = 10


def _start(config: Path, *extra: str) -> subprocess.Popen[bytes]:
    return start_trainer(config, trainer_group_command(2, "train", "--config", str(config), "--member", "a", *extra))


def _log(config: Path) -> str:
    return (config.parent / "trainer.log").read_text()[-4000:]


def _rank(group: subprocess.Popen[bytes], rank: int) -> psutil.Process:
    for child in psutil.Process(group.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no rank {rank} under torchrun pid {group.pid}")


def _wait_published(proc: subprocess.Popen[bytes], client: redis.Redis, run_id: str, n: int, config: Path) -> None:
    deadline = time.monotonic() + 240
    while published_version(client, run_id) < n:
        assert proc.poll() is None, _log(config)
        assert time.monotonic() < deadline, "the group made no progress:\n" + _log(config)
        time.sleep(0.05)


def _setup(tmp_path: Path, model: Path, redis_url: str, strategy: str, **training: object) -> tuple:
    run_id = "tg" + uuid.uuid4().hex[:10]
    client = redis.Redis.from_url(redis_url)
    cfg = make_config(tmp_path, model, redis_url, run_id, distributed={"strategy": strategy}, **training)
    data = cfg.model_dump(mode="json")
    data["members"][0]["trainer_processes"] = 2
    config = tmp_path / "cohort.yaml"
    dump_config(type(cfg).model_validate(data), config)
    produced = {xadd(client, b): b.batch_id for b in make_batches(model, run_id, N_BATCHES)}
    return run_id, client, cfg, config, produced


def test_sigkill_of_rank_1_stops_the_group_and_the_restart_loses_nothing(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, record_figure: Callable[..., None]
) -> None:
    run_id, client, cfg, config, produced = _setup(tmp_path, tiny_model_dir, redis_url, "fsdp2", checkpoint_every=3)
    group = _start(config)
    _wait_published(group, client, run_id, 4, config)  # past the step-3 checkpoint: unacked work in memory
    _rank(group, 1).kill()
    assert group.wait(120) != 0, "torchrun must report the group's failure (the run's restart policy acts on it)"
    before = published_version(client, run_id)
    ckpt = Checkpointer(cfg.checkpoints_dir, "a").latest()
    assert ckpt is not None and is_sharded_checkpoint(ckpt)
    killed = Checkpointer.load_state(ckpt)
    assert killed.step < N_BATCHES, "every batch was done before the kill: nothing was tested"

    group = _start(config, "--idle-exit", "2")
    assert group.wait(300) == 0, _log(config)
    final = Checkpointer.load_state(Checkpointer(cfg.checkpoints_dir, "a").latest())  # type: ignore[arg-type]
    record_figure(
        batches=N_BATCHES,
        steps_in_checkpoint_at_kill=killed.step,
        batches_lost=N_BATCHES - len(set(final.applied)),
        batches_applied_twice=final.step - len(set(final.applied)),
    )
    assert final.step == N_BATCHES and sorted(final.applied) == sorted(produced.values())
    assert applied_ids(client, run_id) == set(produced.values())
    assert client.xpending(redis_keys.batches_stream(run_id, "a"), redis_keys.TRAINER_GROUP)["pending"] == 0
    assert final.weight_version == published_version(client, run_id) > before


def test_a_stopped_group_resumes_at_the_same_step(tmp_path: Path, tiny_model_dir: Path, redis_url: str) -> None:
    run_id, client, cfg, config, produced = _setup(tmp_path, tiny_model_dir, redis_url, "ddp", checkpoint_every=100)
    group = _start(config)
    _wait_published(group, client, run_id, 3, config)
    # As Kubernetes or `corl run` stops it: torchrun passes the signal to the ranks (and exits 1 for it,
    # however cleanly they stop); the leader checkpoints with its followers before they leave.
    group.send_signal(signal.SIGTERM)
    group.wait(120)
    assert client.xpending(redis_keys.batches_stream(run_id, "a"), redis_keys.TRAINER_GROUP)["pending"] == 0
    ckpt = Checkpointer(cfg.checkpoints_dir, "a").latest()
    assert ckpt is not None and is_sharded_checkpoint(ckpt)
    stopped = Checkpointer.load_state(ckpt)
    assert 3 <= stopped.step < N_BATCHES and stopped.weight_version == published_version(client, run_id)

    group = _start(config, "--max-steps", str(stopped.step))  # resumes, finds the step reached, stops
    assert group.wait(300) == 0, _log(config)
    assert f"resumed a from {ckpt.name}: step {stopped.step}" in _log(config)
    assert Checkpointer(cfg.checkpoints_dir, "a").latest() == ckpt  # nothing new was trained or written
