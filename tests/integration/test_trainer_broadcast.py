"""A trainer fed from a real Redis publishes by broadcast to two real replicas of its member (in
this process, on loopback): each version reaches both at once and both serve it; its files follow,
and a server started from them samples exactly what the replicas sample; the run's record says how
versions go. A replica that cannot join gets every version from the files."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis
import torch
from test_trainer_helpers import make_config, pending_count, queue_batches

from corl import redis_keys
from corl.services.model.settings import ServerSettings
from corl.services.model.testing import running_server
from corl.trainer.loop import Trainer
from corl.trainer.policy import PolicyTrainer
from corl.trainer.settings import TrainerSettings
from corl.transfer import shared

torch.set_num_threads(1)
TOKEN = "test-admin-token"
GREEDY = {"prompts": ["1+2=", "13+4=", "20+22="], "n": 1, "max_tokens": 4, "temperature": 0.0}


def _greedy(url: str) -> tuple[int, list[str], list[float]]:
    resp = httpx.post(f"{url}/v1/generate", json=GREEDY, timeout=60)
    resp.raise_for_status()
    body = resp.json()
    samples = [s for r in body["results"] for s in r["samples"]]
    return body["weight_version"], [s["text"] for s in samples], [lp for s in samples for lp in s["logprobs"]]


def _settings(**extra: object) -> TrainerSettings:
    return TrainerSettings(
        consumer="c1",
        block_ms=50,
        admin_token=TOKEN,
        sync_every_s=0.05,
        transfer_timeout_s=20,
        **extra,  # type: ignore[call-arg, arg-type]
    )


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shared-memory", "sockets"])
def test_versions_go_by_broadcast_and_their_files_follow(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, shared_memory: bool
) -> None:
    run_id = "b" + uuid.uuid4().hex[:10]
    client = redis.Redis.from_url(redis_url)
    server = ServerSettings(model_dir=str(tiny_model_dir), name="a", admin_token=TOKEN, num_threads=1)
    with running_server(server) as one, running_server(server) as two:
        cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, servers=[one, two], lr=1e-2)
        assert cfg.training.weight_transfer == "broadcast"  # the default
        queue_batches(client, tiny_model_dir, run_id, 4)
        trainer = Trainer(cfg, "a", _settings(transfer_shared_memory=shared_memory))
        try:
            trainer.setup()
            state = trainer.run(max_steps=4)
            b = trainer.broadcaster
            assert b is not None and b.local == (shared_memory and shared.available())
            if b.local:  # the replicas took the versions' pages as their weights, without a copy
                assert len(b.segments) == 3 and not any(s.linked or s.ref.path.exists() for s in b.segments)
                held = [s for s in b.segments if b.held is not None and s.id in b.held]
                free = [s for s in b.segments if s not in held]
                snapshot = trainer._snapshot
                assert snapshot is not None and len(held) == 2 and any(s.holds(snapshot) for s in held)
                assert b.staging(snapshot) is free[0].views  # the next version goes where no replica is
            # The first publish built the group (both replicas answered): every version went through it.
            assert state.weight_version == 4 and pending_count(client, run_id) == 0
            assert trainer.broadcaster is not None and trainer.broadcaster.replicas == [one, two]
            broadcasts = trainer.metrics.registry.get_sample_value(
                "corl_trainer_weight_broadcast_seconds_count", {"member": "a"}
            )
            assert broadcasts == 4
            assert trainer.store.versions()[-1] == 4 and trainer.latest is not None and trainer.latest.version == 4
            record = client.hgetall(redis_keys.trainer_state(run_id, "a"))
            assert record[b"weight_transfer"] == b"broadcast" and record[b"published_version"] == b"4"
            a, b = _greedy(one), _greedy(two)
            assert a[0] == b[0] == 4 and a[1:] == b[1:]
            files = trainer.store.path(4)
        finally:
            trainer.close()
    # The durable copy: a server started from version 4's files samples what the broadcast served.
    with running_server(ServerSettings(model_dir=str(files), name="a", num_threads=1)) as fresh:
        again = _greedy(fresh)
    assert again[1] == a[1] and again[2] == a[2]


def test_a_replica_that_takes_files_only_gets_every_version_from_them(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str
) -> None:
    run_id = "f" + uuid.uuid4().hex[:10]
    client = redis.Redis.from_url(redis_url)
    server = ServerSettings(model_dir=str(tiny_model_dir), name="a", admin_token=TOKEN, num_threads=1)
    with running_server(server) as one:
        cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, servers=[one], lr=1e-2)
        queue_batches(client, tiny_model_dir, run_id, 2)
        trainer = Trainer(cfg, "a", _settings(transfer_backend="nccl"))  # a group this CPU server cannot join
        try:
            trainer.setup()
            assert trainer.run(max_steps=2).weight_version == 2
            assert trainer.broadcaster is not None and trainer.broadcaster.excluded == {one}
            assert _greedy(one)[0] == 2
            assert client.hget(redis_keys.trainer_state(run_id, "a"), "weight_transfer") == b"files"
        finally:
            trainer.close()


def test_a_version_is_the_weights_of_its_step_though_the_next_step_runs_beside_its_snapshot(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str
) -> None:
    """The snapshot is taken beside the next step, and made slow here: that step's optimizer must wait
    for it, or the version would hold some of the next step's weights."""
    from safetensors.torch import load_file

    run_id = "s" + uuid.uuid4().hex[:10]
    client = redis.Redis.from_url(redis_url)
    server = ServerSettings(model_dir=str(tiny_model_dir), name="a", admin_token=TOKEN, num_threads=1)
    with running_server(server) as one:
        cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, servers=[one], lr=1e-2, keep_versions=10)
        queue_batches(client, tiny_model_dir, run_id, 4)
        trainer = Trainer(cfg, "a", _settings())
        try:
            trainer.setup()
            policy = trainer.policy
            assert isinstance(policy, PolicyTrainer)
            after_step: list[dict[str, torch.Tensor]] = []
            step, snapshot = policy.step, policy.weights_snapshot

            def stepped(batch):  # type: ignore[no-untyped-def]
                out = step(batch)
                after_step.append({n: t.detach().clone() for n, t in policy.model.state_dict().items()})
                return out

            def slow_snapshot(dtype, into=None):  # type: ignore[no-untyped-def]
                assert threading.current_thread() is not threading.main_thread()  # beside the step
                time.sleep(0.4)
                return snapshot(dtype, into)

            policy.step, policy.weights_snapshot = stepped, slow_snapshot  # type: ignore[method-assign]
            assert trainer.run(max_steps=4).weight_version == 4
            assert _greedy(one)[0] == 4
            for version, weights in enumerate(after_step, start=1):
                saved = load_file(trainer.store.path(version) / "model.safetensors")
                assert saved and all(torch.equal(t, weights[n].to(t.dtype)) for n, t in saved.items()), version
            # Steps 2-4 each waited at their optimizer step for the snapshot of the version before.
            stall = trainer.metrics.registry.get_sample_value
            assert stall("corl_trainer_publish_stall_seconds_count", {"member": "a"}) == 3
            assert stall("corl_trainer_publish_stall_seconds_sum", {"member": "a"}) > 0.4
        finally:
            trainer.close()
