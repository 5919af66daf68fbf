"""Aggregator service in-process (httpx.ASGITransport), fake members via httpx.MockTransport, real Redis."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from corl import redis_keys as keys
from corl.config import CohortConfig, parse_config
from corl.proto import ErrorResponse, GradedBatch, RunStats
from corl.services.aggregator import AggregatorSettings, create_app
from corl.services.aggregator.serving import AggregatorServing
from corl.services.aggregator.testing import FakeCohort, FakeMember

_runs = itertools.count()
ADMIN = "admin-secret"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}


ROUND_DEFAULTS: dict[str, Any] = {
    "prompts_per_round": 4,
    "samples_per_prompt": 4,
    "max_pending_batches": 100,
    "request_timeout_s": 5,
}


def make_config(
    names: list[str], *, frozen: tuple[str, ...] = (), reward: dict[str, Any] | None = None, **rounds: Any
) -> CohortConfig:
    data: dict[str, Any] = {
        "run_id": f"svc-{next(_runs)}",
        "members": [
            {
                "name": n,
                "model": "unused",
                "servers": [FakeCohort.url(n)],
                "role": "frozen" if n in frozen else "trained",
            }
            for n in names
        ],
        "rounds": {**ROUND_DEFAULTS, **rounds},
        "reward": reward or {"mode": "peer_label"},
    }
    return parse_config(data)


@asynccontextmanager
async def aggregator(
    cfg: CohortConfig, cohort: FakeCohort, redis_url: str, **settings: Any
) -> AsyncIterator[tuple[AggregatorServing, httpx.AsyncClient]]:
    defaults: dict[str, Any] = {"autostart": False, "quorum_retry_s": 0.05, "backpressure_poll_s": 0.05}
    settings["reward_server"] = {"enabled": True, **settings.get("reward_server", {})}  # the tests use them
    s = AggregatorSettings(
        config=Path("/nonexistent.yaml"), redis_url=redis_url, admin_token=ADMIN, **{**defaults, **settings}
    )
    app = create_app(s, config=cfg, transport=cohort.transport())
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://aggregator") as c:
            yield app.state.serving, c


def sync_redis(url: str) -> Any:
    return redis.Redis.from_url(url)


def read_batches(redis_url: str, cfg: CohortConfig, member: str) -> list[GradedBatch]:
    r = sync_redis(redis_url)
    entries = r.xrange(keys.batches_stream(cfg.run_id, member))
    assert all(set(fields) == {b"batch"} for _, fields in entries)
    batches = [GradedBatch.model_validate_json(fields[b"batch"]) for _, fields in entries]
    # The entry is exactly what the contract model dumps (the driver builds it without the model).
    assert [b.model_dump_json().encode() for b in batches] == [fields[b"batch"] for _, fields in entries]
    return batches


async def test_round_appends_one_valid_batch_per_trained_member(redis_url: str) -> None:
    cfg = make_config(["a", "b", "c"], frozen=("c",))
    cohort = FakeCohort.of("a", "b", "c")
    async with aggregator(cfg, cohort, redis_url) as (svc, _):
        results = [await svc.driver.run_round() for _ in range(2)]
    assert [r.status for r in results] == ["ok", "ok"]
    assert all(r.written == ["a", "b"] for r in results)
    for m in ("a", "b"):
        batches = read_batches(redis_url, cfg, m)
        assert [b.batch_id for b in batches] == [f"{cfg.run_id}-r{i:07d}-{m}" for i in range(2)]
        for b in batches:
            samples = [s for _, s in b.samples()]
            assert len(samples) == 4 * 4 and b.member == m and b.reward_mode == "peer_label"
            assert {s.reward for s in samples} <= {0.0, 1.0}
            assert len(b.groups) == 4 and all(len(g.samples) == 4 for g in b.groups)
            assert all(len(s.logprobs) == len(s.response_token_ids) for s in samples)
            # The batch carries the sampling settings of the run (the trainer's log-probs use them).
            assert b.sampling == cfg.sampling()
            # Unparseable answers never earn reward.
            assert all(s.reward == 0.0 for s in samples if s.answer is None)
    assert read_batches(redis_url, cfg, "c") == []
    # Vote modes cost no model calls beyond generation: one generate per member per round, no grading.
    assert [(m.calls, m.grade_calls) for m in cohort.members.values()] == [(2, 0)] * 3


async def test_down_member_is_left_out_and_rejoins(redis_url: str) -> None:
    cfg = make_config(["a", "b", "c"])
    cohort = FakeCohort.of("a", "b", "c")
    cohort.down.add("c")
    async with aggregator(cfg, cohort, redis_url, http={"attempts": 2, "backoff_initial_s": 0.01}) as (svc, _):
        r0 = await svc.driver.run_round()
        assert (r0.status, r0.written, r0.missing) == ("ok", ["a", "b"], ["c"])
        cohort.down |= {"b"}
        r1 = await svc.driver.run_round()
        assert (r1.status, r1.round) == ("no_quorum", 1)
        assert svc.driver.round_state.cursor == 4  # the prompts of the failed round are taken again
        cohort.down.clear()
        r1 = await svc.driver.run_round()
        assert (r1.status, r1.round, r1.written, r1.missing) == ("ok", 1, ["a", "b", "c"], [])
    assert [b.round for b in read_batches(redis_url, cfg, "c")] == [1]


async def test_transient_503_is_retried(redis_url: str) -> None:
    cfg = make_config(["a", "b"])
    cohort = FakeCohort.of("a", "b")
    cohort.flaky.add("a")
    async with aggregator(cfg, cohort, redis_url, http={"backoff_initial_s": 0.01}) as (svc, _):
        res = await svc.driver.run_round()
    assert res.written == ["a", "b"] and cohort.members["a"].calls == 2


@pytest.mark.parametrize("policy", ["skip", "wait"])
async def test_back_pressure_holds_batches_until_the_trainer_consumes(redis_url: str, policy: str) -> None:
    cfg = make_config(["a", "b"], max_pending_batches=2, backpressure=policy)
    cohort = FakeCohort.of("a", "b")
    r = sync_redis(redis_url)
    stream_a = keys.batches_stream(cfg.run_id, "a")
    async with aggregator(cfg, cohort, redis_url) as (svc, _):
        assert [(await svc.driver.run_round()).status for _ in range(2)] == ["ok", "ok"]
        # Trainer of "a" consumes and acknowledges one batch; "b"'s trainer is stalled.
        ((_, [(entry_id, _)]),) = r.xreadgroup(keys.TRAINER_GROUP, "t-a", {stream_a: ">"}, count=1)
        r.xack(stream_a, keys.TRAINER_GROUP, entry_id)
        res = await svc.driver.run_round()
        if policy == "skip":  # "a" goes on alone, then it is full too
            assert (res.status, res.written) == ("ok", ["a"])
            assert (await svc.driver.run_round()).status == "backpressure"
        else:  # the round waits for "b"'s trainer, so both keep the same rounds
            assert res.status == "backpressure"
    expected_a = 3 if policy == "skip" else 2
    assert len(read_batches(redis_url, cfg, "a")) == expected_a and len(read_batches(redis_url, cfg, "b")) == 2


async def test_retried_round_adds_no_duplicate(redis_url: str) -> None:
    cfg = make_config(["a", "b"])
    cohort = FakeCohort.of("a", "b")
    r = sync_redis(redis_url)
    async with aggregator(cfg, cohort, redis_url) as (svc, _):
        await svc.driver.run_round()
        stale = await svc.driver.run_round()  # sanity: round 1
        assert stale.round == 1
        # An aggregator that crashed before its commit was seen retries round 1: the state says 1 again.
        r.hset(keys.round_state(cfg.run_id), "next_round", 1)
        await svc.driver._load()
        assert (await svc.driver.run_round()).status == "ok"
    async with aggregator(cfg, cohort, redis_url) as (svc2, _):
        svc2.driver.round_state.next_round = 0  # a stale aggregator: its commit is fenced off
        assert (await svc2.driver.run_round()).status == "stale"
        assert svc2.driver.round_state.next_round == 2
    for m in ("a", "b"):
        ids = [b.batch_id for b in read_batches(redis_url, cfg, m)]
        assert ids == [f"{cfg.run_id}-r{i:07d}-{m}" for i in range(2)]


async def test_restart_continues_from_next_round_without_duplicates_or_losses(redis_url: str) -> None:
    cfg = make_config(["a", "b", "c"], max_rounds=6)
    cohort = FakeCohort.of("a", "b", "c")
    cohort.slow = {"a": 0.02}
    async with aggregator(cfg, cohort, redis_url, autostart=True) as (svc, _):
        while svc.driver.round_state.next_round < 2:
            await asyncio.sleep(0.01)
        # Leave mid-run: the driver is cancelled wherever it is (often inside a round).
    done_before = int(sync_redis(redis_url).hget(keys.round_state(cfg.run_id), "next_round"))
    async with aggregator(cfg, cohort, redis_url, autostart=True) as (svc2, _):
        assert svc2.driver.round_state.next_round == done_before
        while svc2.driver.round_state.next_round < 6:
            await asyncio.sleep(0.01)
        ok_rounds = svc2.metrics.rounds.labels("ok")._value.get()
    assert ok_rounds == 6 - done_before  # finished rounds were not graded again
    for m in ("a", "b", "c"):
        batches = read_batches(redis_url, cfg, m)
        assert [b.round for b in batches] == list(range(6))
        assert len({b.batch_id for b in batches}) == 6


async def test_a_stop_signal_halts_the_rounds_before_uvicorn_drains_its_requests(redis_url: str) -> None:
    import signal

    import uvicorn

    from corl.services.aggregator.server import RoundsHaltingServer

    cfg = make_config(["a", "b"])  # no max_rounds: the driver would go on for ever
    cohort = FakeCohort.of("a", "b")
    cohort.slow = {"a": 0.02}
    async with aggregator(cfg, cohort, redis_url, autostart=True) as (svc, client):
        while svc.driver.round_state.next_round < 2:
            await asyncio.sleep(0.01)
        server = RoundsHaltingServer(uvicorn.Config(client._transport.app))  # type: ignore[attr-defined]
        server.handle_exit(signal.SIGTERM, None)
        assert server.should_exit
        await asyncio.sleep(0.1)  # the cancelled round unwinds
        halted_at = svc.driver.round_state.next_round
        await asyncio.sleep(0.5)  # a running driver makes several rounds in this time
        assert svc.driver.round_state.next_round == halted_at
        assert (await client.get("/readyz")).status_code in (200, 503)  # requests are still served


async def test_stats_and_metrics(redis_url: str) -> None:
    cfg = make_config(["a", "b", "c"], reward={"mode": "peer_agreement"})
    cohort = FakeCohort(
        {
            "a": FakeCohort.of("a").members["a"],
            "b": FakeCohort.of("b", accuracy=0.5).members["b"],
            "c": FakeCohort.of("c", accuracy=0.9).members["c"],
        }
    )
    async with aggregator(cfg, cohort, redis_url) as (svc, client):
        for _ in range(3):
            await svc.driver.run_round()
        resp = await client.get(f"/v1/runs/{cfg.run_id}/stats")
        assert resp.status_code == 200
        stats = RunStats.model_validate_json(resp.content)
        missing = await client.get("/v1/runs/nope/stats")
        metrics = (await client.get("/metrics")).text
    assert stats.next_round == 3 and [r.round for r in stats.rounds] == [0, 1, 2]
    last = stats.rounds[-1]
    assert set(last.members) == {"a", "b", "c"} and set(last.agreement["a"]) == {"a", "b", "c"}
    for ms in last.members.values():
        assert ms.pseudo_label_accuracy is not None and 0 < ms.mean_reward < 1 and ms.batch_written
        assert 1 <= ms.distinct_answers <= 4 and ms.mean_response_tokens > 1
    assert set(stats.grader_weights) == {"a", "b", "c"}
    assert missing.status_code == 404
    assert ErrorResponse.model_validate_json(missing.content).error.type == "not_found"
    assert 'corl_aggregator_rounds_total{status="ok"} 3.0' in metrics
    assert 'corl_aggregator_mean_reward{member="a"}' in metrics


async def test_posted_prompts_source(redis_url: str) -> None:
    cfg = make_config(["a", "b"], prompt_source={"kind": "http"})
    async with aggregator(cfg, FakeCohort.of("a", "b"), redis_url) as (svc, client):
        assert (await svc.driver.run_round()).status == "no_prompts"
        body = {"prompts": [{"prompt": "12+30=", "answer": "42"}, {"prompt": "01+01="}]}
        assert (await client.post("/v1/prompts", json=body)).status_code == 401
        resp = await client.post("/v1/prompts", json=body, headers=ADMIN_AUTH)
        assert resp.status_code == 200 and resp.json() == {"accepted": 2, "queued": 2}
        res = await svc.driver.run_round()
        assert res.status == "ok" and res.samples == 2 * 2 * 4
        assert (await svc.driver.run_round()).status == "no_prompts"
        bad = await client.post("/v1/prompts", json={"prompts": [{"prompt": ""}]}, headers=ADMIN_AUTH)
    assert bad.status_code == 422
    err = ErrorResponse.model_validate_json(bad.content).error
    assert err.type == "invalid_request" and err.field == "prompts.0.prompt"
    assert [g.prompt for g in read_batches(redis_url, cfg, "a")[0].groups] == ["12+30=", "01+01="]


async def test_posting_prompts_to_a_task_run_conflicts(redis_url: str) -> None:
    cfg = make_config(["a", "b"])
    async with aggregator(cfg, FakeCohort.of("a", "b"), redis_url) as (_, client):
        resp = await client.post("/v1/prompts", json={"prompts": [{"prompt": "1+1="}]}, headers=ADMIN_AUTH)
    assert resp.status_code == 409 and resp.json()["error"]["type"] == "conflict"


@pytest.mark.parametrize("mode", ["peer_label", "peer_agreement", "self_vote", "ground_truth"])
async def test_every_vote_mode_produces_batches(redis_url: str, mode: str) -> None:
    cfg = make_config(["a", "b"], reward={"mode": mode})
    async with aggregator(cfg, FakeCohort.of("a", "b"), redis_url) as (svc, _):
        assert (await svc.driver.run_round()).written == ["a", "b"]
    assert read_batches(redis_url, cfg, "a")[0].reward_mode == mode


@pytest.mark.parametrize("action", ["alarm", "hold"])
async def test_the_collapse_guard_trips_on_a_member_that_copies_the_question(redis_url: str, action: str) -> None:
    """A member that starts answering with the prompt's own operand trips the guard (its echo share
    rises); with ``hold`` its trainer gets no more batches while the others train on."""
    guard = {"action": action, "warmup_rounds": 1, "window": 1, "patience": 1}
    cfg = make_config(["a", "b"], samples_per_prompt=8, reward={"mode": "peer_label", "guard": guard})
    cohort = FakeCohort.of("a", "b", accuracy=0.6)
    async with aggregator(cfg, cohort, redis_url) as (svc, client):
        await svc.driver.run_round()  # the start
        cohort.members["a"].echo = True
        written = (await svc.driver.run_round()).written
        stats = RunStats.model_validate_json((await client.get(f"/v1/runs/{cfg.run_id}/stats")).content)
        metrics = (await client.get("/metrics")).text
    assert stats.collapse == ["a"]
    assert stats.rounds[1].members["a"].echo_share == 1.0
    assert stats.rounds[0].members["a"].echo_share < 0.2
    assert written == (["b"] if action == "hold" else ["a", "b"])
    assert stats.rounds[1].members["a"].batch_written is (action == "alarm")
    assert 'corl_aggregator_collapse_alarm{member="a"} 1.0' in metrics
    assert 'corl_aggregator_collapse_alarm{member="b"} 0.0' in metrics


@pytest.mark.parametrize("mode", ["peer_pool", "peer_soft"])
async def test_vote_samples_are_drawn_at_their_temperature_and_set_the_labels(redis_url: str, mode: str) -> None:
    """``reward.votes``: one more generate call per member (greedy here) whose answers are the peers'
    ballots; the fake members' samples are mostly wrong but their greedy answers right, so every
    label is the truth and a sample is rewarded exactly when it is right."""
    votes = {"samples": 1, "temperature": 0.0}
    cfg = make_config(["a", "b", "c"], temperature=0.7, reward={"mode": mode, "votes": votes})
    cohort = FakeCohort.of("a", "b", "c", accuracy=0.2)
    async with aggregator(cfg, cohort, redis_url) as (svc, _):
        assert (await svc.driver.run_round()).status == "ok"
    assert all(m.generated == [(0.7, 4), (0.0, 1)] for m in cohort.members.values())
    batch = read_batches(redis_url, cfg, "a")[0]
    truth = {g.prompt: str(sum(map(int, g.prompt.rstrip("=").split("+")))) for g in batch.groups}
    for g, s in batch.samples():
        assert (s.reward == 1.0) == (s.answer == truth[g.prompt])
    assert [g.weight for g in batch.groups] == [1.0] * 4  # two peers' greedy ballots agree: full weight


async def test_a_teacher_votes_for_its_student_and_no_one_else(redis_url: str) -> None:
    """``teacher_of``: a frozen member that is always right votes for ``a`` only: a's labels are
    the truth, b's (supervised by a alone, who is always wrong) never are."""
    cfg = make_config(["a", "b", "t"], frozen=("t",), reward={"mode": "peer_pool"})
    cfg.members[2].teacher_of = "a"
    cohort = FakeCohort({"a": FakeMember("a", 0.0), "b": FakeMember("b", 0.0), "t": FakeMember("t", 1.0)})
    async with aggregator(cfg, cohort, redis_url) as (svc, client):
        assert (await svc.driver.run_round()).written == ["a", "b"]
        stats = RunStats.model_validate_json((await client.get(f"/v1/runs/{cfg.run_id}/stats")).content)
    assert stats.rounds[0].members["a"].label_accuracy == 1.0
    assert not stats.rounds[0].members["b"].label_accuracy  # None (no label) or 0.0: never the truth


@pytest.mark.parametrize("mode", ["peer_label", "peer_agreement"])
async def test_dataset_answers_never_reach_peer_rewards(redis_url: str, mode: str) -> None:
    """Poisoned dataset answers change the logged accuracy, never the rewards."""
    prompts = [f"{i:02d}+{i + 1:02d}=" for i in range(4)]
    rewards = {}
    for tag, answers in (("true", [str(2 * i + 1) for i in range(4)]), ("poisoned", ["999"] * 4)):
        cfg = make_config(["a", "b", "c"], reward={"mode": mode}, prompt_source={"kind": "http"})
        async with aggregator(cfg, FakeCohort.of("a", "b", "c", accuracy=0.6), redis_url) as (svc, client):
            body = {"prompts": [{"prompt": p, "answer": t} for p, t in zip(prompts, answers, strict=True)]}
            assert (await client.post("/v1/prompts", json=body, headers=ADMIN_AUTH)).status_code == 200
            await svc.driver.run_round()
            stats = RunStats.model_validate_json((await client.get(f"/v1/runs/{cfg.run_id}/stats")).content)
        rewards[tag] = {m: [s.reward for _, s in read_batches(redis_url, cfg, m)[0].samples()] for m in "abc"}
        accuracy = stats.rounds[0].members["a"].pseudo_label_accuracy
        assert (accuracy == 0.0) == (tag == "poisoned")
    assert rewards["true"] == rewards["poisoned"]
