"""The trainer fed from a real Redis with batches sampled from a real tiny model (in-process)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
import redis
import torch
from safetensors.torch import load_file
from test_trainer_helpers import applied_ids, make_batches, make_config, pending_count, queue_batches, xadd
from test_trainer_publish import FakeReplica

from corl import redis_keys
from corl.trainer.checkpoint import Checkpointer
from corl.trainer.loop import Trainer
from corl.trainer.metrics import TrainerMetrics
from corl.trainer.settings import TrainerSettings
from corl.weights_store import digest

torch.set_num_threads(1)


@pytest.fixture
def run_id() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def _settings(**kw: object) -> TrainerSettings:
    return TrainerSettings(consumer="c1", block_ms=50, **kw)  # type: ignore[arg-type]


def _value(metrics: TrainerMetrics, name: str) -> float:
    v = metrics.registry.get_sample_value(name, {"member": "a"})
    return 0.0 if v is None else v


def _trainer(cfg, **kw) -> Trainer:  # type: ignore[no-untyped-def]
    t = Trainer(cfg, "a", kw.pop("settings", _settings()), **kw)
    t.setup()
    return t


def test_batches_are_applied_published_and_acked(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str
) -> None:
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, checkpoint_every=2, keep_versions=2)
    batches = queue_batches(client, tiny_model_dir, run_id, 3)
    trainer = _trainer(cfg)
    state = trainer.run(max_steps=3)
    trainer.close()

    assert state.step == 3 and state.weight_version == 3
    versions = sorted(p.name for p in (tmp_path / "weights" / "a").glob("v*"))
    assert versions == ["v000002", "v000003"]  # keep_versions=2
    newest = tmp_path / "weights" / "a" / "v000003"
    assert (newest / "SHA256").read_text().strip() == digest(newest)
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(newest / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before), "training did not change the weights"
    # Every batch is acknowledged only with a checkpoint that holds it: nothing pending, all recorded.
    assert pending_count(client, run_id) == 0
    assert applied_ids(client, run_id) == {b.batch_id for b in batches}
    assert client.xlen(redis_keys.batches_stream(run_id, "a")) == 0  # acknowledged, then deleted: Redis holds none
    ckpt = Checkpointer(cfg.checkpoints_dir, "a").latest()
    assert ckpt is not None and Checkpointer.load_state(ckpt).step == 3
    m = trainer.metrics
    assert _value(m, "corl_trainer_batches_applied_total") == 3
    assert _value(m, "corl_trainer_weight_version") == 3
    assert _value(m, "corl_trainer_tokens_per_second") > 0
    assert _value(m, "corl_trainer_step_seconds_count") == 3


def test_replayed_batch_is_applied_once(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str
) -> None:
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id)
    (batch,) = make_batches(tiny_model_dir, run_id, 1)
    xadd(client, batch)
    xadd(client, batch)  # the same batch id delivered twice
    trainer = _trainer(cfg)
    state = trainer.run(idle_exit_s=0.2)
    trainer.close()
    assert state.step == 1 and state.weight_version == 1
    assert _value(trainer.metrics, "corl_trainer_duplicate_batches_total") == 1
    assert pending_count(client, run_id) == 0


def test_a_trainer_told_to_keep_acknowledged_batches_keeps_them(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str
) -> None:
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id)
    queue_batches(client, tiny_model_dir, run_id, 2)
    trainer = _trainer(cfg, settings=_settings(keep_acked=True))
    trainer.run(max_steps=2)
    trainer.close()
    assert pending_count(client, run_id) == 0 and client.xlen(redis_keys.batches_stream(run_id, "a")) == 2


def test_stale_batches_are_dropped_and_counted(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str
) -> None:
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id)
    cfg.training.max_staleness = 1
    batches = queue_batches(client, tiny_model_dir, run_id, 3)
    trainer = _trainer(cfg)
    state = trainer.run(idle_exit_s=0.2)
    trainer.close()
    # version 0 -> applied (v1), lag 1 -> applied (v2), lag 2 > 1 -> dropped
    assert state.step == 2
    assert _value(trainer.metrics, "corl_trainer_stale_batches_dropped_total") == 1
    dropped = {x.decode() for x in client.smembers(redis_keys.trainer_dropped(run_id, "a"))}
    assert dropped == {batches[2].batch_id}
    assert pending_count(client, run_id) == 0


def test_a_stale_batch_brings_a_restarted_replica_to_the_newest_weights(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str
) -> None:
    """A batch generated on weights older than max_staleness means its replica restarted (or missed
    pushes): the trainer syncs it at once, not at the next idle sync (which may never come while
    rounds keep arriving on the old weights)."""
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, servers=["http://replica.test"])
    cfg.training.max_staleness = 1
    replica = FakeReplica()
    http = httpx.Client(transport=httpx.MockTransport(replica), timeout=5)
    queue_batches(client, tiny_model_dir, run_id, 3)
    trainer = _trainer(cfg, http=http, settings=_settings(admin_token="tok"))
    for _ in range(2):  # applied and published as v1, v2 (each pushed to the replica)
        trainer._handle(trainer.stream.next(50))  # type: ignore[arg-type]
    replica.version = 0  # the server restarted on its base weights
    trainer._handle(trainer.stream.next(50))  # type: ignore[arg-type]
    trainer.close()
    assert _value(trainer.metrics, "corl_trainer_stale_batches_dropped_total") == 1
    assert [p.version for p in replica.pushes] == [1, 2, 2] and replica.version == 2


def test_dead_consumers_pending_batches_are_reclaimed_and_resume_continues(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str
) -> None:
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, checkpoint_every=1)
    batches = make_batches(tiny_model_dir, run_id, 3)
    stream = redis_keys.batches_stream(run_id, "a")
    client.xgroup_create(stream, redis_keys.TRAINER_GROUP, id="0", mkstream=True)
    for b in batches[:2]:
        xadd(client, b)
    # A consumer that read both batches and died before acknowledging them.
    client.xreadgroup(redis_keys.TRAINER_GROUP, "dead", {stream: ">"}, count=2)
    assert pending_count(client, run_id) == 2

    first = _trainer(cfg, settings=_settings(claim_idle_ms=0))
    assert first.run(idle_exit_s=0.2).step == 2
    first.close()
    assert pending_count(client, run_id) == 0

    xadd(client, batches[2])
    second = _trainer(cfg)  # resumes from the checkpoint: step and versions continue
    assert (second.state.step, second.state.weight_version) == (2, 2)
    state = second.run(idle_exit_s=0.2)
    second.close()
    assert (state.step, state.weight_version) == (3, 3)
    assert applied_ids(client, run_id) == {b.batch_id for b in batches}


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
def test_every_loss_type_trains_with_micro_batches(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str, loss_type: str
) -> None:
    cfg = make_config(
        tmp_path,
        tiny_model_dir,
        redis_url,
        run_id,
        loss_type=loss_type,
        micro_batch_size=5,
        beta=0.04,
        steps_per_batch=2,
        epsilon_high=0.28,
    )
    (batch,) = make_batches(tiny_model_dir, run_id, 1)
    xadd(client, batch)
    trainer = _trainer(cfg)
    assert trainer.run(max_steps=1).step == 1
    trainer.close()
    assert _value(trainer.metrics, "corl_trainer_loss") != 0.0
    assert _value(trainer.metrics, "corl_trainer_ref_kl") > 0.0  # second optimizer step moved off the start


# bnpo is left out on purpose: like TRL it normalises by each micro-batch's own token count.
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_micro_batches_cut_to_their_own_longest_answer_give_the_whole_batch_gradient(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, loss_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corl.trainer import policy as policy_mod

    (batch,) = make_batches(tiny_model_dir, "mb", 1, prompts=3)
    # Answers of 1 and 4 tokens in every group (sampled ones all run to max_tokens): the step orders a
    # group's rows by length, so micro-batches of 2 hold (1, 1) and (4, 4) and the first is cut to 1.
    for g in batch.groups:
        for j, s in enumerate(g.samples):
            s.response_token_ids, s.logprobs = s.response_token_ids[: 1 + 3 * (j % 2)], s.logprobs[: 1 + 3 * (j % 2)]
    widths: list[int] = []
    real_logps = policy_mod.response_logps

    def spy(model, ids, attn, response_len, **kw):  # type: ignore[no-untyped-def]
        widths.append(response_len)
        return real_logps(model, ids, attn, response_len, **kw)

    def uncut(mask: torch.Tensor, size: int) -> list[tuple[slice, int]]:  # the reference: nothing cut
        return [(slice(0, mask.size(0)), mask.size(1))]

    monkeypatch.setattr(policy_mod, "response_logps", spy)
    deltas = []
    # 12 sequences: one forward over all, padded to 4 tokens; then 6 micro-batches of 2, each cut
    for micro, chunking in ((None, uncut), (2, policy_mod._micro_batches)):
        monkeypatch.setattr(policy_mod, "_micro_batches", chunking)
        cfg = make_config(
            tmp_path, tiny_model_dir, redis_url, "mb", loss_type=loss_type, micro_batch_size=micro, grad_clip=1e6
        )
        policy = policy_mod.PolicyTrainer(cfg, "a", torch.device("cpu"))
        policy.optimizer = torch.optim.SGD(policy.params, lr=1.0)  # the update is exactly minus the gradient
        start = [p.detach().clone() for p in policy.params]
        widths.clear()
        policy.step(batch)
        deltas.append(torch.cat([(p.detach() - s).flatten() for p, s in zip(policy.params, start, strict=True)]))
    assert sorted(widths) == [1, 1, 1, 4, 4, 4], widths  # the short answers' micro-batches were cut
    assert deltas[0].abs().max() > 0
    torch.testing.assert_close(deltas[1], deltas[0], rtol=1e-4, atol=1e-6)


def test_metrics_endpoint_serves_trainer_metrics(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str
) -> None:
    import httpx

    from corl.redis_server import free_port

    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id)
    queue_batches(client, tiny_model_dir, run_id, 2)
    port = free_port()
    trainer = _trainer(cfg, settings=_settings(metrics_port=port, metrics_host="127.0.0.1"))
    trainer.run(max_steps=1)
    trainer._on_idle()  # refreshes the backlog gauge
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    trainer.close()
    for name in (
        "loss",
        "mean_reward",
        "advantage_std",
        "clip_fraction_ratio",
        "approx_kl",
        "entropy_nats",
        "step_seconds_count",
        "tokens_per_second",
        "stale_batches_dropped_total",
        "version_lag",
        "stream_backlog_batches",
        "weight_version",
    ):
        assert f'corl_trainer_{name}{{member="a"' in text, name
    assert 'corl_trainer_stream_backlog_batches{member="a"} 1.0' in text


def test_batch_without_signal_is_acked_without_update_or_publish(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str
) -> None:
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id)
    (batch,) = make_batches(tiny_model_dir, run_id, 1, prompts=3)
    groups = [
        g.model_copy(update={"samples": [s.model_copy(update={"reward": 1.0}) for s in g.samples]})
        for g in batch.groups
    ]
    flat = batch.model_copy(update={"groups": groups})
    xadd(client, flat)
    trainer = _trainer(cfg)
    state = trainer.run(idle_exit_s=0.2)
    trainer.close()
    assert (state.step, state.optimizer_steps, state.weight_version) == (1, 0, 0)
    assert not list((tmp_path / "weights" / "a").glob("v*"))
    assert _value(trainer.metrics, "corl_trainer_groups_skipped_total") == 3
    assert pending_count(client, run_id) == 0 and applied_ids(client, run_id) == {batch.batch_id}


def test_batches_lost_in_a_crash_are_applied_again_not_dropped_for_the_version_jump(
    tmp_path: Path, tiny_model_dir: Path, redis_url: str, client: redis.Redis, run_id: str
) -> None:
    """A crash lost versions 2 and 3 (published after the checkpoint at version 1); the restarted
    trainer republishes the checkpoint as version 4 and applies the two lost batches again: the jump
    in numbers is not staleness, even with max_staleness 1."""
    cfg = make_config(tmp_path, tiny_model_dir, redis_url, run_id, checkpoint_every=100, max_staleness=1)
    batches = []
    for version, b in enumerate(make_batches(tiny_model_dir, run_id, 3)):  # sampled by versions 0, 1, 2
        groups = [
            g.model_copy(update={"samples": [s.model_copy(update={"weight_version": version}) for s in g.samples]})
            for g in b.groups
        ]
        batches.append(b.model_copy(update={"groups": groups}))
        xadd(client, batches[-1])
    first = _trainer(cfg)
    first._handle(first.stream.next(50))  # type: ignore[arg-type]
    first.checkpoint()  # step 1 at version 1
    for _ in range(2):
        first._handle(first.stream.next(50))  # type: ignore[arg-type]
    first.close()  # killed: versions 2 and 3 published, their batches never checkpointed

    second = _trainer(cfg)
    assert second.state.weight_version == 4  # republished above everything published before
    state = second.run(idle_exit_s=0.2)
    second.close()
    assert _value(second.metrics, "corl_trainer_stale_batches_dropped_total") == 0
    assert state.applied == [b.batch_id for b in batches] and (state.step, state.weight_version) == (3, 6)
    assert pending_count(client, run_id) == 0
