"""Grading pool: registration and auth, pull (leases, deadlines, idempotent results, 403), push
(own timeout, never stalls a round), limits (429, 413), and hostile graders beside honest peers."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from test_aggregator import ADMIN, aggregator, make_config, read_batches, sync_redis

from corl import redis_keys as keys
from corl.proto import GradedBatch, GraderRegistered, GradingTasks
from corl.services.aggregator.testing import FakeCohort, FakeMember

JUDGE = {"mode": "peer_judge", "judge": {"k": 2}}


def truth(prompt: str) -> str:
    return str(sum(int(x) for x in prompt.rstrip("=").split("+")))


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def register(client: httpx.AsyncClient, name: str, mode: str, url: str | None = None) -> str:
    body = {"name": name, "mode": mode, **({"url": url} if url else {})}
    resp = await client.post("/v1/graders", json=body, headers=auth(ADMIN))
    assert resp.status_code == 201, resp.text
    return GraderRegistered.model_validate_json(resp.content).token


async def test_registration_needs_the_admin_token_and_stores_only_a_hash(redis_url: str) -> None:
    cfg = make_config(["a", "b"])
    async with aggregator(cfg, FakeCohort.of("a", "b"), redis_url) as (_, client):
        body = {"name": "agent-1", "mode": "pull"}
        assert (await client.post("/v1/graders", json=body)).status_code == 401
        wrong = await client.post("/v1/graders", json=body, headers=auth("nope"))
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "unauthorized"
        resp = await client.post("/v1/graders", json=body, headers=auth(ADMIN))
        reg = GraderRegistered.model_validate_json(resp.content)
        assert resp.status_code == 201 and reg.weight < 0.5  # probation
        assert (await client.post("/v1/graders", json=body, headers=auth(ADMIN))).status_code == 409
        member = await client.post("/v1/graders", json={"name": "a", "mode": "pull"}, headers=auth(ADMIN))
        assert member.status_code == 409
        no_url = await client.post("/v1/graders", json={"name": "p", "mode": "push"}, headers=auth(ADMIN))
        assert no_url.status_code == 422
        assert (await client.get("/v1/grading/tasks")).status_code == 401
        assert (await client.get("/v1/grading/tasks", headers=auth("forged"))).status_code == 401
        assert (await client.get("/v1/grading/tasks", headers=auth(reg.token))).json() == {"tasks": []}
    r = sync_redis(redis_url)
    stored = [r.dump(k) for k in r.scan_iter(f"corl:{cfg.run_id}:*")]
    assert not any(reg.token.encode() in blob for blob in stored if blob)


async def test_pull_grader_leases_tasks_and_results_are_idempotent(redis_url: str) -> None:
    cfg = make_config(["a", "b", "c"], reward=JUDGE, prompts_per_round=2, samples_per_prompt=2)
    async with aggregator(
        cfg, FakeCohort.of("a", "b", "c"), redis_url, grading={"pull_deadline_s": 3, "lease_s": 5}
    ) as (svc, client):
        token = await register(client, "puller", "pull")
        other = await register(client, "other", "pull")
        round_task = asyncio.create_task(svc.driver.run_round())
        resp = await client.get("/v1/grading/tasks", params={"max": 100, "wait": 2}, headers=auth(token))
        tasks = GradingTasks.model_validate_json(resp.content).tasks
        assert len(tasks) == 3 * 2 * 2 and all(t.mode == "judge" and t.deadline > time.time() for t in tasks)
        # The other grader has its own queue; a result for a task leased to "puller" is forbidden.
        other_tasks = (await client.get("/v1/grading/tasks", params={"max": 100}, headers=auth(other))).json()
        assert len(other_tasks["tasks"]) == 12
        stolen = {"results": [{"task_id": tasks[0].task_id, "score": 1.0}]}
        forbidden = await client.post("/v1/grading/results", json=stolen, headers=auth(other))
        assert forbidden.status_code == 403 and forbidden.json()["error"]["type"] == "forbidden"
        scores = {
            "results": [{"task_id": t.task_id, "score": 0.9 if t.response == truth(t.prompt) else 0.1} for t in tasks]
        }
        first = await client.post("/v1/grading/results", json=scores, headers=auth(token))
        again = await client.post("/v1/grading/results", json=scores, headers=auth(token))
        assert first.json() == {"accepted": 12, "ignored": 0} and again.json() == {"accepted": 0, "ignored": 12}
        res = await round_task  # "other" never answers: the round ends at the deadline, no later
        late = await client.post(
            "/v1/grading/results",
            json={"results": [{"task_id": t["task_id"], "score": 0.5} for t in other_tasks["tasks"]]},
            headers=auth(other),
        )
        assert late.json() == {"accepted": 0, "ignored": 12}
        assert res.status == "ok"
        assert "puller" in svc.state.reliability.weights and svc.state.reliability.observations["puller"] >= 1
    assert len(read_batches(redis_url, cfg, "a")) == 1


async def test_unanswered_lease_is_reoffered_then_dropped_after_the_deadline(redis_url: str) -> None:
    cfg = make_config(["a", "b"])
    async with aggregator(cfg, FakeCohort.of("a", "b"), redis_url, grading={"lease_s": 0.5}) as (svc, client):
        token = await register(client, "slowpoke", "pull")
        t0, t1 = await svc.pool.offer(7, "slowpoke", [("01+02=", "3"), ("02+02=", "5")], deadline := time.time() + 2.5)
        first = (await client.get("/v1/grading/tasks", params={"max": 1}, headers=auth(token))).json()["tasks"]
        second = (await client.get("/v1/grading/tasks", params={"max": 5}, headers=auth(token))).json()["tasks"]
        assert [t["task_id"] for t in first] == [t0] and t0.startswith("r7.") and t0.endswith(".slowpoke.0")
        assert [t["task_id"] for t in second] == [t1]
        await asyncio.sleep(0.6)  # leases expired: both are offered again
        again = (await client.get("/v1/grading/tasks", params={"max": 5, "wait": 0.5}, headers=auth(token))).json()
        assert sorted(t["task_id"] for t in again["tasks"]) == sorted([t0, t1])
        answer = {"results": [{"task_id": t0, "score": 0.0}]}
        assert (await client.post("/v1/grading/results", json=answer, headers=auth(token))).json()["accepted"] == 1
        await asyncio.sleep(0.6)  # only the unanswered task comes back
        third = (await client.get("/v1/grading/tasks", params={"max": 5}, headers=auth(token))).json()["tasks"]
        assert [t["task_id"] for t in third] == [t1]
        await asyncio.sleep(max(0.0, deadline - time.time()) + 0.1)  # past the deadline: dropped, not offered
        t0 = time.monotonic()
        gone = (await client.get("/v1/grading/tasks", params={"max": 5, "wait": 0.5}, headers=auth(token))).json()
        assert gone == {"tasks": []} and time.monotonic() - t0 >= 0.4  # the long poll waited


async def test_a_retried_round_never_reads_the_failed_attempts_scores(redis_url: str) -> None:
    """The same round offered again (its first attempt failed) holds new responses: a score a grader gave
    the first attempt's task must not be read for the second's."""
    cfg = make_config(["a", "b"])
    async with aggregator(cfg, FakeCohort.of("a", "b"), redis_url) as (svc, client):
        token = await register(client, "puller", "pull")
        (first,) = await svc.pool.offer(9, "puller", [("01+02=", "3")], deadline := time.time() + 5)
        answer = {"results": [{"task_id": first, "score": 1.0}]}
        assert (await client.post("/v1/grading/results", json=answer, headers=auth(token))).json()["accepted"] == 1
        (retry,) = await svc.pool.offer(9, "puller", [("01+02=", "7")], deadline)
        assert retry != first
        assert await svc.pool.collect(9, {retry: "puller"}, time.time() + 0.3) == {}  # nothing graded it yet
        assert await svc.pool.collect(9, {first: "puller"}, time.time() + 0.3) == {first: 1.0}


async def test_push_graders_are_called_and_a_slow_one_never_stalls_the_round(redis_url: str) -> None:
    cfg = make_config(["a", "b", "c"], reward=JUDGE)
    cohort = FakeCohort.of("a", "b", "c")
    cohort.members |= {"pusher": FakeMember("pusher"), "sloth": FakeMember("sloth")}
    cohort.slow = {"sloth": 30.0}
    async with aggregator(cfg, cohort, redis_url, grading={"push_timeout_s": 0.3}) as (svc, client):
        await register(client, "pusher", "push", FakeCohort.url("pusher"))
        await register(client, "sloth", "push", FakeCohort.url("sloth"))
        t0 = time.monotonic()
        res = await svc.driver.run_round()
        elapsed = time.monotonic() - t0
        metrics = (await client.get("/metrics")).text
    assert res.status == "ok" and elapsed < 3.0
    assert cohort.members["pusher"].grade_calls == 1
    # Each response was judged by k=2 peers, never by its author.
    assert [m.grade_calls for n, m in cohort.members.items() if n in "abc"] == [1, 1, 1]
    assert 'corl_aggregator_push_grader_failures_total{grader="sloth"} 1.0' in metrics
    # Judged rewards follow the honest verdicts: right answers score high, wrong ones low.
    for g, s in read_batches(redis_url, cfg, "a")[0].samples():
        right = s.response == truth(g.prompt)
        assert (s.reward > 0.5) == right


async def test_rate_limit_and_body_limit(redis_url: str) -> None:
    cfg = make_config(["a", "b"])
    async with aggregator(
        cfg, FakeCohort.of("a", "b"), redis_url, grading={"rate_limit_per_min": 3, "max_body_bytes": 2048}
    ) as (_, client):
        token = await register(client, "chatty", "pull")
        codes = [(await client.get("/v1/grading/tasks", headers=auth(token))).status_code for _ in range(4)]
        big = {"results": [{"task_id": f"t{i:04d}", "score": 0.5} for i in range(200)]}
        too_big = await client.post("/v1/grading/results", json=big, headers=auth(token))
    assert codes == [200, 200, 200, 429]
    assert too_big.status_code == 413 and too_big.json()["error"]["type"] == "payload_too_large"


@pytest.mark.parametrize("combine", ["mean", "median"])
async def test_hostile_graders_barely_move_rewards(redis_url: str, combine: str) -> None:
    """An always-1.0 grader and a random one beside 4 honest member graders: mean rewards move < 0.05."""
    reward = {"mode": "peer_judge", "judge": {"k": 3, "combine": combine}}
    names = ["a", "b", "c", "d"]

    async def mean_rewards(with_hostile: bool) -> dict[str, float]:
        cfg = make_config(names, reward=reward, prompts_per_round=8)
        cohort = FakeCohort.of(*names, accuracy=0.5)
        cohort.members |= {"yes": FakeMember("yes", judge="always_one"), "dice": FakeMember("dice", judge="random")}
        async with aggregator(cfg, cohort, redis_url) as (svc, client):
            if with_hostile:
                await register(client, "yes", "push", FakeCohort.url("yes"))
                await register(client, "dice", "push", FakeCohort.url("dice"))
            for _ in range(4):
                assert (await svc.driver.run_round()).status == "ok"
        out = {}
        for m in names:
            batches: list[GradedBatch] = read_batches(redis_url, cfg, m)
            rewards = [s.reward for b in batches for _, s in b.samples()]
            out[m] = sum(rewards) / len(rewards)
        return out

    honest, attacked = await mean_rewards(False), await mean_rewards(True)
    assert all(abs(honest[m] - attacked[m]) < 0.05 for m in names), (honest, attacked)


def test_keys_of_the_pool_live_under_the_run() -> None:
    assert keys.grading_task("r", "t").startswith("corl:r:") and keys.grader_tokens("r").startswith("corl:r:")


async def test_a_silent_pull_grader_gets_no_tasks_and_does_not_hold_rounds(redis_url: str) -> None:
    cfg = make_config(["a", "b"], reward=JUDGE)
    async with aggregator(
        cfg, FakeCohort.of("a", "b"), redis_url, grading={"pull_active_s": 0.2, "pull_deadline_s": 30}
    ) as (svc, client):
        token = await register(client, "ghost", "pull")
        await asyncio.sleep(0.3)  # registered, then silent
        t0 = time.monotonic()
        assert (await svc.driver.run_round()).status == "ok"
        assert time.monotonic() - t0 < 5
        tasks = (await client.get("/v1/grading/tasks", params={"max": 100}, headers=auth(token))).json()["tasks"]
    assert tasks == []
