"""Live updates of the members the gateway serves: a hot swap under traffic fails no request, and the
canary rule holds a new version to its share of traffic until the evaluator's reading of it is in, then
promotes it (swapped into the stable replicas) or rolls it back (no more traffic for it)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import redis

from corl import redis_keys as keys
from corl.config import CohortConfig, parse_config
from corl.heldout import write_reading
from corl.proto import HeldoutAccuracy
from corl.services.gateway import GatewaySettings, create_app
from corl.services.gateway.testing import FakeUpstream, Router

_runs = itertools.count()
ADMIN = "admin-token-for-promotions"


def canary_config(tmp_path: Path, **canary: Any) -> CohortConfig:
    return parse_config(
        {
            "run_id": f"canary-{next(_runs)}",
            "weights_dir": str(tmp_path / "weights"),
            "members": [
                {"name": "a", "model": "unused", "servers": ["http://trained"]},
                {"name": "b", "model": "unused", "servers": ["http://b"]},
            ],
            "gateway": {"canary": {"share": 0.2, "stable": {"a": ["http://stable"]}, **canary}},
        }
    )


def publish(cfg: CohortConfig, member: str, version: int) -> None:
    """A version in the weights store as a trainer leaves it (the checksum file is what a promotion reads)."""
    folder = Path(cfg.weights_dir) / member / f"v{version:06d}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "SHA256").write_text(f"{version:064x}\n")


def read(redis_url: str, cfg: CohortConfig, version: int, accuracy: float) -> None:
    """The evaluator's reading of member a's first server (the trained one) at ``version``."""
    reading = HeldoutAccuracy(accuracy=accuracy, weight_version=version, at=0.0)
    write_reading(redis.Redis.from_url(redis_url), cfg.run_id, "a", reading)


async def traffic(c: httpx.AsyncClient, n: int = 400) -> Counter[str]:
    """Which replica answered each of ``n`` requests for member a (by the text it answers with)."""
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}
    replies = await asyncio.gather(*(c.post("/v1/chat/completions", json=body) for _ in range(n)))
    assert {r.status_code for r in replies} == {200}
    return Counter(json.loads(r.content)["choices"][0]["message"]["content"].split()[0] for r in replies)


async def test_a_worse_version_is_rolled_back_and_a_good_one_promoted(tmp_path: Path, redis_url: str) -> None:
    cfg = canary_config(tmp_path)
    trained, stable = FakeUpstream("trained", version=0), FakeUpstream("stable", version=0)
    router = Router(trained=trained, stable=stable, b=FakeUpstream("b"))
    s = GatewaySettings(
        _env_file=None,  # type: ignore[call-arg]
        config=Path("/x"),
        redis_url=redis_url,
        admin_token=ADMIN,
        autostart=False,
    )
    app = create_app(s, config=cfg, transport=router.transport())
    async with app.router.lifespan_context(app):
        canary = app.state.canary
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            read(redis_url, cfg, 0, 0.50)  # the start reading: version 0 on both
            assert await canary.step() == {"a": "wait"}
            even = await traffic(c)
            assert 120 <= even["trained"] <= 280  # one replica each: an even split

            # Version 1, made worse on purpose: the trainer swaps it into the trained replica.
            trained.version = 1
            publish(cfg, "a", 1)
            assert await canary.step() == {"a": "wait"}  # not read yet: the canary share only
            held = await traffic(c)
            assert 40 <= held["trained"] <= 130  # 20% of 400
            read(redis_url, cfg, 1, 0.30)
            assert await canary.step() == {"a": "rollback"}
            assert (await traffic(c))["trained"] == 0  # rolled back: all traffic on the serving version
            assert stable.version == 0 and stable.weights == []

            # Version 2 is good: a canary share, then promoted into the stable replica.
            trained.version = 2
            publish(cfg, "a", 2)
            assert await canary.step() == {"a": "wait"}
            assert 40 <= (await traffic(c))["trained"] <= 130
            read(redis_url, cfg, 2, 0.55)
            assert await canary.step() == {"a": "promote"}
            metrics = (await c.get("/metrics")).text
    assert stable.version == 2
    [promotion] = stable.weights
    assert promotion["version"] == 2 and promotion["uri"].endswith("a/v000002") and promotion["format"] == "full"
    assert promotion["sha256"] == f"{2:064x}"
    assert stable.seen[-1].headers["authorization"] == f"Bearer {ADMIN}"
    assert 'corl_gateway_canary_decisions_total{decision="rollback",member="a"} 1.0' in metrics
    assert 'corl_gateway_canary_decisions_total{decision="promote",member="a"} 1.0' in metrics
    assert 'corl_gateway_serving_version{member="a"} 2.0' in metrics


async def test_without_a_reading_of_the_serving_version_nothing_is_promoted(tmp_path: Path, redis_url: str) -> None:
    cfg = canary_config(tmp_path)
    trained, stable = FakeUpstream("trained", version=3), FakeUpstream("stable", version=1)
    router = Router(trained=trained, stable=stable, b=FakeUpstream("b"))
    s = GatewaySettings(_env_file=None, config=Path("/x"), redis_url=redis_url, autostart=False)  # type: ignore[call-arg]
    app = create_app(s, config=cfg, transport=router.transport())
    async with app.router.lifespan_context(app):
        read(redis_url, cfg, 3, 0.9)
        assert await app.state.canary.step() == {"a": "wait"}
        assert app.state.canary.members["a"].upstream.trained_share == 0.2
    assert stable.weights == []
    assert not redis.Redis.from_url(redis_url).exists(keys.harvest_pool(cfg.run_id))


def test_a_hot_swap_under_gateway_traffic_fails_no_request(
    server_settings: Any, make_weights: Any, redis_url: str
) -> None:
    """A real model server (the tiny model) behind the gateway: requests keep flowing, streamed and not,
    while two new versions are swapped in; every one is answered, by the version it reports."""
    from corl.services.model.testing import running_server, serve_app

    new = [make_weights(seed) for seed in (1, 2)]
    settings = server_settings.model_copy(update={"cohort_token": None})
    with running_server(settings) as server:
        cfg = parse_config(
            {
                "run_id": f"swap-{next(_runs)}",
                "members": [
                    {"name": "tiny", "model": "unused", "servers": [server]},
                    {"name": "b", "model": "unused", "servers": ["http://127.0.0.1:1"]},
                ],
            }
        )
        gs = GatewaySettings(_env_file=None, config=Path("/x"), redis_url=redis_url)  # type: ignore[call-arg]
        with serve_app(create_app(gs, config=cfg)) as gateway:

            async def drive() -> list[tuple[int, str]]:
                async with httpx.AsyncClient(base_url=gateway, timeout=60) as c:
                    stop = asyncio.Event()

                    async def agent(i: int) -> list[tuple[int, str]]:
                        seen = []
                        while not stop.is_set():
                            body = {"model": "tiny", "messages": [{"role": "user", "content": "12+34="}]}
                            body |= {"max_tokens": 3, "stream": i % 2 == 1}
                            r = await c.post("/v1/chat/completions", json=body)
                            seen.append((r.status_code, r.headers.get("x-corl-weight-version", "")))
                        return seen

                    agents = [asyncio.create_task(agent(i)) for i in range(6)]
                    async with httpx.AsyncClient(base_url=server, timeout=60) as admin:
                        for version, (path, sha) in enumerate(new, 1):
                            await asyncio.sleep(0.5)
                            body = {"version": version, "uri": str(path), "sha256": sha}
                            resp = await admin.post(
                                "/v1/weights", json=body, headers={"Authorization": "Bearer test-admin-token"}
                            )
                            assert resp.status_code == 200, resp.text
                    await asyncio.sleep(0.5)
                    stop.set()
                    return [s for task in agents for s in await task]

            seen = asyncio.run(drive())
    statuses = Counter(status for status, _ in seen)
    versions = Counter(version for _, version in seen)
    assert statuses == {200: len(seen)} and len(seen) > 30
    assert set(versions) == {"0", "1", "2"}, versions
