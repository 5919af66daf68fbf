"""Graders earn trust from the cohort's vote consensus, not from weak judges' scores: among 4 members
that judge poorly, an outside grader that scores by the true answer gains weight and ends above
every hostile grader (always 1, always 0, random, inverted) and at or above the median member within
30 rounds, and the hostile graders together move the mean reward by less than 0.05."""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable

import httpx
from test_aggregator import ADMIN, aggregator, make_config, read_batches

from corl.proto import GraderRegistered
from corl.services.aggregator.testing import FakeCohort

MEMBERS = ["a", "b", "c", "d"]
ROUNDS = 30
Policy = Callable[[bool, random.Random], float]  # (response is right, rng) -> score

HONEST: dict[str, Policy] = {"careful": lambda right, _: 1.0 if right else 0.0}
HOSTILE: dict[str, Policy] = {
    "yes": lambda right, _: 1.0,
    "no": lambda right, _: 0.0,
    "dice": lambda right, rng: rng.random(),
    "liar": lambda right, _: 0.0 if right else 1.0,
}


def is_right(prompt: str, response: str) -> bool:
    a, b = prompt.rstrip("=").split("+")
    return response.strip() == str(int(a) + int(b))


async def pull_grader(client: httpx.AsyncClient, name: str, policy: Policy, stop: asyncio.Event) -> int:
    """Register as a pull grader, then lease tasks and answer them until stopped; returns tasks answered."""
    resp = await client.post(
        "/v1/graders", json={"name": name, "mode": "pull"}, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    token = GraderRegistered.model_validate_json(resp.content).token
    auth, rng, answered = {"Authorization": f"Bearer {token}"}, random.Random(name), 0
    while not stop.is_set():
        tasks = (await client.get("/v1/grading/tasks", params={"max": 256, "wait": 0.2}, headers=auth)).json()["tasks"]
        if tasks:
            results = [
                {"task_id": t["task_id"], "score": policy(is_right(t["prompt"], t["response"]), rng)} for t in tasks
            ]
            assert (
                await client.post("/v1/grading/results", json={"results": results}, headers=auth)
            ).status_code == 200
            answered += len(tasks)
    return answered


async def run(redis_url: str, graders: dict[str, Policy]) -> tuple[dict[str, float], float]:
    """30 peer_judge rounds; returns the effective grader weights and the members' mean reward."""
    cfg = make_config(MEMBERS, reward={"mode": "peer_judge", "judge": {"k": 2}}, prompts_per_round=8)
    cohort = FakeCohort.of(*MEMBERS, accuracy=0.5)
    for m in cohort.members.values():  # weak judges: right 30% of the time, else a random score
        m.judge, m.judge_accuracy = "noisy", 0.3
    async with aggregator(cfg, cohort, redis_url, grading={"pull_deadline_s": 5.0}) as (svc, client):
        stop = asyncio.Event()
        loops = [asyncio.create_task(pull_grader(client, n, p, stop)) for n, p in graders.items()]
        await asyncio.sleep(0.3)  # registered and polling
        for _ in range(ROUNDS):
            assert (await svc.driver.run_round()).status == "ok"
        stop.set()
        assert all(n > 0 for n in await asyncio.gather(*loops))  # every grader took part
        weights = svc.state.reliability.effective_weights()
    rewards = [s.reward for m in MEMBERS for b in read_batches(redis_url, cfg, m) for _, s in b.samples()]
    return weights, sum(rewards) / len(rewards)


async def test_a_careful_outside_grader_earns_trust_and_hostile_ones_lose_it(redis_url: str) -> None:
    weights, attacked = await run(redis_url, {**HONEST, **HOSTILE})
    members = sorted(weights[m] for m in MEMBERS)
    assert all(weights["careful"] > weights[h] for h in HOSTILE), weights
    assert weights["careful"] >= statistics.median(members), weights
    assert weights["careful"] > 0.5, weights  # it gained weight from its probation start (0.1)
    _, honest_only = await run(redis_url, HONEST)
    assert abs(attacked - honest_only) < 0.05, (attacked, honest_only)
