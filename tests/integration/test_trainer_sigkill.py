"""Acceptance: `corl train` killed with SIGKILL mid-run and restarted loses no batch, applies none
twice, and never reuses a weight version."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from test_trainer_helpers import applied_ids, make_batches, make_config, published_version, start_trainer, xadd

from corl import redis_keys
from corl.config import dump_config
from corl.embedded.processes import corl_command
from corl.trainer.checkpoint import Checkpointer

N_BATCHES = 12


def _start(config: Path, *extra: str) -> subprocess.Popen[bytes]:
    return start_trainer(config, corl_command("train", "--config", str(config), "--member", "a", *extra))


def _check_applied_or_pending(client: redis.Redis, run_id: str, produced: dict[str, str]) -> tuple[set, set]:
    """Every produced entry is acknowledged with its batch recorded as applied, or not acknowledged."""
    stream = redis_keys.batches_stream(run_id, "a")
    pel = {e["message_id"].decode() for e in client.xpending_range(stream, redis_keys.TRAINER_GROUP, "-", "+", 1000)}
    group = next(g for g in client.xinfo_groups(stream) if g["name"] == redis_keys.TRAINER_GROUP.encode())
    last = group["last-delivered-id"].decode()

    def key(eid: str) -> tuple[int, int]:
        a, b = eid.split("-")
        return int(a), int(b)

    applied = applied_ids(client, run_id)
    unacked = {eid for eid in produced if eid in pel or key(eid) > key(last)}
    acked = set(produced) - unacked
    assert {produced[e] for e in acked} == applied & set(produced.values()), "an acknowledged batch is not applied"
    assert applied <= set(produced.values())
    return acked, unacked


@pytest.mark.slow
@pytest.mark.chaos
def test_sigkill_mid_run_then_restart(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, record_figure: Callable[..., None]
) -> None:
    run_id = "k" + uuid.uuid4().hex[:10]
    client = redis.Redis.from_url(redis_url)
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, checkpoint_every=3)
    config = tmp_path / "cohort.yaml"
    dump_config(cfg, config)
    produced = {xadd(client, b): b.batch_id for b in make_batches(tiny_model_dir, run_id, N_BATCHES)}

    proc = _start(config)
    deadline = time.monotonic() + 180
    while published_version(client, run_id) < 4:  # step 4 is past the step-3 checkpoint: unacked work in memory
        assert proc.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "trainer made no progress"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    before = published_version(client, run_id)
    acked, unacked = _check_applied_or_pending(client, run_id, produced)
    assert unacked, "the kill landed after every batch was done: nothing was tested"
    ckpt = Checkpointer(cfg.checkpoints_dir, "a").latest()
    assert ckpt is not None
    killed_state = Checkpointer.load_state(ckpt)
    assert killed_state.step == len(acked) and set(killed_state.applied) == {produced[e] for e in acked}

    t0 = time.monotonic()
    proc = _start(config, "--idle-exit", "1.5")
    assert proc.wait(300) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finish_s = time.monotonic() - t0 - 1.5  # less the idle wait before it exits
    unacked_at_kill = len(unacked)
    acked, unacked = _check_applied_or_pending(client, run_id, produced)
    assert not unacked and applied_ids(client, run_id) == set(produced.values())
    final = Checkpointer.load_state(Checkpointer(cfg.checkpoints_dir, "a").latest())  # type: ignore[arg-type]
    record_figure(
        batches=N_BATCHES,
        unacknowledged_at_kill=unacked_at_kill,
        batches_lost=N_BATCHES - len(set(final.applied)),
        batches_applied_twice=final.step - len(set(final.applied)),
        seconds_restart_to_all_applied=round(finish_s, 2),
    )
    # Exactly once: one step per batch in the surviving lineage, each id once.
    assert final.step == N_BATCHES and sorted(final.applied) == sorted(produced.values())
    # Versions kept increasing across the kill: the restart published above everything seen before.
    after = published_version(client, run_id)
    assert final.weight_version == after > before
    assert after >= before + (N_BATCHES - killed_state.step)
    log = (tmp_path / "trainer.log").read_text()
    assert "republishing" in log or killed_state.weight_version == before


@pytest.mark.slow
def test_sigterm_flushes_and_exits_cleanly(tmp_path: Path, tiny_model_dir: Path, redis_url: str) -> None:
    run_id = "g" + uuid.uuid4().hex[:10]
    client = redis.Redis.from_url(redis_url)
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, checkpoint_every=100)
    config = tmp_path / "cohort.yaml"
    dump_config(cfg, config)
    produced = {xadd(client, b): b.batch_id for b in make_batches(tiny_model_dir, run_id, 6)}
    proc = _start(config)
    deadline = time.monotonic() + 180
    while published_version(client, run_id) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "trainer.log").read_text()[-3000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    acked, _ = _check_applied_or_pending(client, run_id, produced)
    stream = redis_keys.batches_stream(run_id, "a")
    assert client.xpending(stream, redis_keys.TRAINER_GROUP)["pending"] == 0  # everything it took is durable
    state = Checkpointer.load_state(Checkpointer(cfg.checkpoints_dir, "a").latest())  # type: ignore[arg-type]
    assert state.step == len(acked) >= 2 and state.weight_version == published_version(client, run_id)
