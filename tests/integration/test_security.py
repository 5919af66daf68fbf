"""Security at the HTTP edge of both services, driven by their own OpenAPI documents: every admin and
grader route refuses a missing or wrong token (and the refusals are counted), grader tokens are rate
limited, a grader cannot read or answer another grader's tasks, and oversized bodies get 413 before a
byte of them is read."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from corl.config import parse_config
from corl.services.aggregator import AggregatorSettings
from corl.services.aggregator import create_app as create_aggregator
from corl.services.aggregator.testing import FakeCohort
from corl.services.model.app import create_app as create_model_server
from corl.services.model.settings import ServerSettings
from corl.services.model.testing import FakeBackend

ADMIN = "admin-secret"
COHORT = "cohort-token-for-tests"
REWARD = "reward-token-for-tests"
# Routes anyone may call; every other route must declare a token (a new route that forgets is caught).
PUBLIC = {
    "model": {
        "GET /healthz",
        "GET /readyz",
        "GET /metrics",
        "GET /v1/info",
    },
    "aggregator": {
        "GET /healthz",
        "GET /readyz",
        "GET /metrics",
        "GET /v1/runs/{run}/stats",
        "GET /v1/runs/{run}/dashboard",
        "GET /dashboard",
    },
}
SECURED = {
    "model": {
        "POST /v1/weights": "admin",
        "POST /v1/weights/transfer": "admin",
        "POST /v1/weights/broadcast": "admin",
        "POST /v1/generate": "cohort",
        "POST /v1/grade": "cohort",
        "POST /v1/chat/completions": "cohort",
        "POST /v1/completions": "cohort",
        "GET /v1/models": "cohort",
    },
    "aggregator": {
        "POST /v1/prompts": "admin",
        "POST /get_reward": "reward",
        "POST /v1/reward": "reward",
        "POST /v1/graders": "admin",
        "GET /v1/grading/tasks": "grader",
        "POST /v1/grading/results": "grader",
    },
}
BAD_HEADERS = [
    {},
    {"Authorization": "Bearer wrong-token"},
    {"Authorization": "Basic YTpi"},
    {"Authorization": "Bearer "},
]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _config(run: str) -> Any:
    return parse_config(
        {
            "run_id": run,
            "members": [{"name": n, "model": "unused", "servers": [FakeCohort.url(n)]} for n in ("a", "b")],
            "rounds": {"prompt_source": {"kind": "http"}},
        }
    )


@asynccontextmanager
async def services(redis_url: str, **grading: Any) -> AsyncIterator[dict[str, tuple[FastAPI, httpx.AsyncClient]]]:
    model = create_model_server(
        ServerSettings(_env_file=None, model_dir="unused", admin_token=ADMIN, cohort_token=COHORT, max_body_bytes=4096),  # type: ignore[call-arg]
        FakeBackend(),
    )
    settings = AggregatorSettings(
        config=Path("/nonexistent.yaml"),
        redis_url=redis_url,
        admin_token=ADMIN,
        autostart=False,
        grading={"max_body_bytes": 4096, **grading},
        reward_server={"enabled": True, "token": REWARD},
    )
    aggregator = create_aggregator(
        settings, config=_config(f"sec-{time.monotonic_ns()}"), transport=FakeCohort.of("a", "b").transport()
    )
    async with model.router.lifespan_context(model), aggregator.router.lifespan_context(aggregator):
        await model.state.serving.wait_ready(5)
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=model), base_url="http://model") as mc,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=aggregator), base_url="http://agg") as ac,
        ):
            yield {"model": (model, mc), "aggregator": (aggregator, ac)}


def operations(app: FastAPI) -> dict[str, list[str]]:
    """``"METHOD /path"`` -> the security schemes it declares, from the app's OpenAPI document."""
    return {
        f"{method.upper()} {path}": [name for req in op.get("security", []) for name in req]
        for path, ops in app.openapi()["paths"].items()
        for method, op in ops.items()
    }


def auth_failures(registry: CollectorRegistry, prefix: str, route: str) -> float:
    return registry.get_sample_value(f"{prefix}_auth_failures_total", {"route": route}) or 0.0


async def register(client: httpx.AsyncClient, name: str) -> str:
    resp = await client.post("/v1/graders", json={"name": name, "mode": "pull"}, headers=auth(ADMIN))
    assert resp.status_code == 201, resp.text
    return str(resp.json()["token"])


async def test_every_admin_and_grader_route_refuses_missing_and_wrong_tokens(redis_url: str) -> None:
    async with services(redis_url) as apps:
        _, agg = apps["aggregator"]
        grader_token = await register(agg, "honest")  # a valid grader token is still no admin token
        for service, (app, client) in apps.items():
            ops = operations(app)
            secured = {op: schemes for op, schemes in ops.items() if schemes}
            assert set(ops) - set(secured) == PUBLIC[service], "a route without a declared token"
            assert {op: s[0] for op, s in secured.items()} == SECURED[service]
            prefix = "corl_server" if service == "model" else "corl_aggregator"
            for op, schemes in secured.items():
                method, path = op.split(" ", 1)
                bad = [*BAD_HEADERS, auth(grader_token) if schemes == ["admin"] else auth(ADMIN)]
                before = auth_failures(app.state.metrics.registry, prefix, path)
                for headers in bad:
                    # An empty body: authentication comes before validation, so it is 401, not 422.
                    r = await client.request(method, path, json={}, headers=headers)
                    assert r.status_code in (401, 403), (op, headers, r.status_code, r.text)
                    assert r.json()["error"]["type"] in ("unauthorized", "forbidden")
                    if r.status_code == 401:
                        assert r.headers["WWW-Authenticate"] == "Bearer"
                counted = auth_failures(app.state.metrics.registry, prefix, path) - before
                assert counted == len(bad), (op, counted)


async def test_grader_tokens_are_rate_limited_per_grader(redis_url: str) -> None:
    async with services(redis_url, rate_limit_per_min=3) as apps:
        _, agg = apps["aggregator"]
        greedy, other = await register(agg, "greedy"), await register(agg, "other")
        window = int(time.time() // 60)
        statuses = [(await agg.get("/v1/grading/tasks", headers=auth(greedy))).status_code for _ in range(5)]
        limited = await agg.get("/v1/grading/tasks", headers=auth(greedy))
        if int(time.time() // 60) == window:  # (a new minute starts a new window)
            assert statuses == [200, 200, 200, 429, 429]
            assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limited"
            assert 1 <= int(limited.headers["Retry-After"]) <= 60  # seconds until the next window
        assert (await agg.get("/v1/grading/tasks", headers=auth(other))).status_code == 200


async def test_a_grader_cannot_read_or_answer_another_graders_tasks(redis_url: str) -> None:
    async with services(redis_url) as apps:
        aggregator, agg = apps["aggregator"]
        alice, mallory = await register(agg, "alice"), await register(agg, "mallory")
        pool = aggregator.state.serving.pool
        ids = await pool.offer(3, "alice", [("01+02=", "3"), ("02+02=", "5")], time.time() + 30)
        seen = (await agg.get("/v1/grading/tasks", params={"max": 10}, headers=auth(mallory))).json()["tasks"]
        assert seen == []  # mallory's queue is her own: alice's tasks never reach it
        forged = {"results": [{"task_id": t, "score": 1.0} for t in ids]}
        stolen = await agg.post("/v1/grading/results", json=forged, headers=auth(mallory))
        assert stolen.status_code == 403 and stolen.json()["error"]["field"] == "results.task_id"
        tasks = (await agg.get("/v1/grading/tasks", params={"max": 10}, headers=auth(alice))).json()["tasks"]
        assert sorted(t["task_id"] for t in tasks) == sorted(ids)
        honest = {"results": [{"task_id": t, "score": 0.5} for t in ids]}
        accepted = await agg.post("/v1/grading/results", json=honest, headers=auth(alice))
        assert accepted.json() == {"accepted": 2, "ignored": 0}  # mallory's attempt wrote nothing
        got = await pool.collect(3, dict.fromkeys(ids, "alice"), time.time() + 1)
        assert got == dict.fromkeys(ids, 0.5)


@pytest.mark.parametrize(
    ("service", "path"),
    [
        ("model", "/v1/generate"),
        ("model", "/v1/weights"),
        ("aggregator", "/v1/graders"),
        ("aggregator", "/v1/grading/results"),
    ],
)
async def test_oversized_bodies_get_413_before_they_are_read(redis_url: str, service: str, path: str) -> None:
    async with services(redis_url) as apps:
        app, client = apps[service]
        r = await client.post(path, content=b"x" * 5000, headers={"Content-Type": "application/json", **auth(ADMIN)})
        assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"
        # A declared length over the bound is refused without reading the body at all.
        reads: list[str] = []
        sent: list[MutableMapping[str, Any]] = []

        async def receive() -> dict[str, Any]:
            reads.append("body")
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-length", b"10000000"), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1),
            "server": ("test", 80),
            "app": app,
        }
        await app(scope, receive, send)
        assert sent[0]["status"] == 413 and reads == []
        # A chunked body is cut off once it passes the bound: the rest is never read.
        chunks = iter([b"x" * 3000, b"x" * 3000, b"x" * 3000])
        reads.clear()

        async def receive_chunks() -> dict[str, Any]:
            reads.append("chunk")
            return {"type": "http.request", "body": next(chunks), "more_body": True}

        sent.clear()
        chunked = {**scope, "headers": [(b"content-type", b"application/json")]}
        await app(chunked, receive_chunks, send)
        assert sent[0]["status"] == 413 and len(reads) == 2
