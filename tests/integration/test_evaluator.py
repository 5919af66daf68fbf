"""The evaluator service in-process (httpx.ASGITransport), fake members through httpx.MockTransport, real
Redis: its readings reach the run's hash, its /metrics, its own route and the aggregator's stats and
dashboard; it reads again only every K versions, counts what fails and tries it again, and a restarted
evaluator goes on from the recorded readings."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families
from test_aggregator import aggregator, sync_redis

from corl import redis_keys as keys
from corl.config import CohortConfig, parse_config
from corl.heldout import read_readings
from corl.proto import DashboardView, ErrorResponse, HeldoutReadings, RunStats
from corl.redis_server import free_port
from corl.services.aggregator.testing import FakeCohort, FakeEndpoint
from corl.services.evaluator import EvaluatorSettings, create_app
from corl.services.evaluator.serving import EvaluatorServing

_runs = itertools.count()
EVAL_PROMPTS = 8  # one generate request per reading


def make_config() -> CohortConfig:
    """Two trained members, a frozen one, and an outside endpoint (which the evaluator never reads)."""
    served = [
        {"name": n, "model": "unused", "servers": [FakeCohort.url(n)], "role": role}
        for n, role in (("a", "trained"), ("b", "trained"), ("c", "frozen"))
    ]
    ext = {"name": "ext", "endpoint": {"base_url": "http://ext.endpoint/v1", "model": "ext"}}
    return parse_config(
        {
            "run_id": f"eval-{next(_runs)}",
            "members": [*served, ext],
            "rounds": {"prompts_per_round": 4, "samples_per_prompt": 4, "request_timeout_s": 5},
        }
    )


def fake_cohort() -> FakeCohort:
    fake = FakeCohort.of("a", "b", "c")
    fake.endpoints["ext"] = FakeEndpoint("ext")
    return fake


@asynccontextmanager
async def evaluator(
    cfg: CohortConfig, fake: FakeCohort, redis_url: str, **settings: Any
) -> AsyncIterator[tuple[EvaluatorServing, httpx.AsyncClient]]:
    s = EvaluatorSettings(
        config=Path("/nonexistent.yaml"),
        redis_url=redis_url,
        **{"autostart": False, "eval_every": 2, "eval_prompts": EVAL_PROMPTS, "record_attempts": 1, **settings},
    )
    app = create_app(s, config=cfg, transport=fake.sync_transport())
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://evaluator") as c:
            yield app.state.serving, c


async def poll(svc: EvaluatorServing) -> list[str]:
    return await asyncio.to_thread(svc.poll)  # as the service's own thread does


async def metric(c: httpx.AsyncClient, name: str, **labels: str) -> float | None:
    text = (await c.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def readings_of(c: httpx.AsyncClient, run: str) -> HeldoutReadings:
    r = await c.get(f"/v1/runs/{run}/heldout")
    assert r.status_code == 200, r.text
    return HeldoutReadings.model_validate(r.json())


def generate_calls(fake: FakeCohort) -> dict[str, int]:
    return {name: m.calls for name, m in fake.members.items()}


async def test_readings_reach_redis_prometheus_and_the_aggregators_stats_and_dashboard(redis_url: str) -> None:
    cfg, fake = make_config(), fake_cohort()
    fake.members["a"].weight_version = 3
    async with evaluator(cfg, fake, redis_url) as (svc, c):
        assert (await c.get("/readyz")).status_code == 200
        assert (await readings_of(c, cfg.run_id)).members == {}
        assert sorted(await poll(svc)) == ["a", "b", "c"]  # the endpoint member has no weights to follow
        view = await readings_of(c, cfg.run_id)
        accuracy = await metric(c, "corl_evaluator_heldout_accuracy_ratio", member="a")
        version = await metric(c, "corl_evaluator_heldout_weight_version", member="a")
        timed = await metric(c, "corl_evaluator_evaluation_duration_seconds_count", member="a")
    assert (view.eval_every, view.eval_prompts) == (2, EVAL_PROMPTS) and set(view.members) == {"a", "b", "c"}
    # Greedy answers of the fake members are right: the reading is 1.0, at the version the server said.
    assert view.members["a"].accuracy == 1.0 and view.members["a"].weight_version == 3
    assert (accuracy, version, timed) == (1.0, 3.0, 1.0)

    r = sync_redis(redis_url)
    key = keys.heldout_accuracy(cfg.run_id)
    assert read_readings(r.hgetall(key)) == view.members and r.ttl(key) > 0

    async with aggregator(cfg, fake, redis_url) as (_, agg):
        stats = RunStats.model_validate((await agg.get(f"/v1/runs/{cfg.run_id}/stats")).json())
        dash = DashboardView.model_validate((await agg.get(f"/v1/runs/{cfg.run_id}/dashboard")).json())
    assert stats.heldout == view.members
    shown = {m.name: (m.heldout_accuracy, m.heldout_version) for m in dash.members}
    assert shown == {"a": (1.0, 3), "b": (1.0, 0), "c": (1.0, 0), "ext": (None, None)}


async def test_a_member_is_read_again_every_k_versions_and_a_frozen_one_once(redis_url: str) -> None:
    cfg, fake = make_config(), fake_cohort()
    async with evaluator(cfg, fake, redis_url, eval_every=2) as (svc, c):
        assert sorted(await poll(svc)) == ["a", "b", "c"]
        first = generate_calls(fake)
        assert await poll(svc) == [] and generate_calls(fake) == first  # nothing moved: nothing read
        fake.members["a"].weight_version = 1
        assert await poll(svc) == []  # one version on, K is 2
        fake.members["a"].weight_version = 2
        fake.members["b"].weight_version = 5
        assert await poll(svc) == ["a", "b"]
        view = await readings_of(c, cfg.run_id)
    assert {n: r.weight_version for n, r in view.members.items()} == {"a": 2, "b": 5, "c": 0}
    assert generate_calls(fake) == {"a": first["a"] + 1, "b": first["b"] + 1, "c": first["c"]}


async def test_failures_are_counted_and_tried_again_at_the_next_poll(redis_url: str) -> None:
    cfg, fake = make_config(), fake_cohort()
    fake.down.add("b")  # its /v1/info does not answer
    fake.flaky.add("c")  # 503 on its first generate call
    async with evaluator(cfg, fake, redis_url) as (svc, c):
        assert await poll(svc) == ["a"]
        down = await metric(c, "corl_evaluator_failures_total", member="b", stage="version")
        failed = await metric(c, "corl_evaluator_failures_total", member="c", stage="evaluate")
        assert (await c.get("/readyz")).status_code == 200  # still serving
        fake.down.clear()
        assert sorted(await poll(svc)) == ["b", "c"]
        view = await readings_of(c, cfg.run_id)
    assert (down, failed) == (1.0, 1.0) and set(view.members) == {"a", "b", "c"}


async def test_a_reading_redis_refused_is_written_later_without_reading_again(redis_url: str) -> None:
    cfg, fake = make_config(), fake_cohort()
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    async with evaluator(cfg, fake, dead) as (svc, c):
        assert sorted(await poll(svc)) == ["a", "b", "c"]
        refused = await metric(c, "corl_evaluator_failures_total", member="a", stage="record")
        assert (await readings_of(c, cfg.run_id)).members.keys() == {"a", "b", "c"}  # served all the same
        calls = generate_calls(fake)
        svc.redis = redis.Redis.from_url(redis_url)  # Redis is back
        assert await poll(svc) == [] and generate_calls(fake) == calls
    assert refused == 1.0
    assert set(read_readings(sync_redis(redis_url).hgetall(keys.heldout_accuracy(cfg.run_id)))) == {"a", "b", "c"}


async def test_a_restarted_evaluator_goes_on_from_the_recorded_readings(redis_url: str) -> None:
    cfg, fake = make_config(), fake_cohort()
    async with evaluator(cfg, fake, redis_url) as (svc, _):
        await poll(svc)
    calls = generate_calls(fake)
    async with evaluator(cfg, fake, redis_url) as (svc, c):
        assert await poll(svc) == [] and generate_calls(fake) == calls  # read before the restart: not again
        restored = await readings_of(c, cfg.run_id)
        gauge = await metric(c, "corl_evaluator_heldout_accuracy_ratio", member="b")
        fake.members["b"].weight_version = 2
        assert await poll(svc) == ["b"]
    assert set(restored.members) == {"a", "b", "c"} and gauge == 1.0


async def test_another_runs_readings_are_404(redis_url: str) -> None:
    cfg, fake = make_config(), fake_cohort()
    async with evaluator(cfg, fake, redis_url) as (_, c):
        r = await c.get("/v1/runs/nope/heldout")
        health = await c.get("/healthz")
    assert r.status_code == 404 and ErrorResponse.model_validate(r.json()).error.type == "not_found"
    assert health.status_code == 200
