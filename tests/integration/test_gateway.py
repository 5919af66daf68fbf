"""The harvesting gateway in-process (``httpx.ASGITransport``), its members faked with
``httpx.MockTransport`` (``FakeUpstream``), a real Redis for the prompt pool.

What an agent app sees: its request reaches the member its model names byte for byte, the reply comes
back unchanged (status, body, headers), and harvesting never fails or delays it: a full queue or a
dead Redis drops the prompt (counted), never the request. What the pool sees: only what the policy
admits (route, member, sampling, size), redacted before it is written, once per conversation.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from corl import redis_keys as keys
from corl.config import CohortConfig, parse_config
from corl.proto import ErrorResponse, ModelList
from corl.proto.gateway import HarvestedPrompt, HarvestStats
from corl.services.gateway import GatewaySettings, create_app
from corl.services.gateway.serving import GatewayServing
from corl.services.gateway.testing import FakeUpstream, Router
from corl.services.model.testing import serve_app

_runs = itertools.count()
TOKEN = "cohort-secret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KEY_ENV, KEY = "CORL_TEST_GATEWAY_KEY", "sk-ops-5d1e0b7c"
SECRET = "sk-live-9f8e7d6c5b4a"


def config(harvest: dict[str, Any] | None = None, **extra: Any) -> CohortConfig:
    return parse_config(
        {
            "run_id": f"gw-{next(_runs)}",
            "members": [
                {"name": "a", "model": "unused", "servers": ["http://a1", "http://a2"]},
                {"name": "b", "model": "unused", "servers": ["http://b1"]},
                {
                    "name": "ops",
                    "endpoint": {"base_url": "http://ops/v1", "model": "gpt-ops", "api_key_env": KEY_ENV},
                },
            ],
            "gateway": {"harvest": {"redact": {"patterns": [r"sk-live-\w+"]}, **(harvest or {})}},
            **extra,
        }
    )


def fakes() -> Router:
    return Router(a1=FakeUpstream("a1"), a2=FakeUpstream("a2"), b1=FakeUpstream("b1"), ops=FakeUpstream("ops"))


@asynccontextmanager
async def gateway(
    cfg: CohortConfig, router: Router, redis_url: str, **settings: Any
) -> AsyncIterator[tuple[GatewayServing, httpx.AsyncClient]]:
    s = GatewaySettings(
        _env_file=None,  # type: ignore[call-arg]
        config=Path("/nonexistent.yaml"),
        redis_url=redis_url,
        cohort_token=TOKEN,
        **settings,
    )
    app = create_app(s, config=cfg, transport=router.transport())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", headers=AUTH) as c:
            yield app.state.serving, c


@pytest.fixture(autouse=True)
def endpoint_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


def pool(redis_url: str, cfg: CohortConfig) -> list[HarvestedPrompt]:
    r = redis.Redis.from_url(redis_url)
    return [HarvestedPrompt.model_validate_json(f[b"prompt"]) for _, f in r.xrange(keys.harvest_pool(cfg.run_id))]


def chat_body(model: str, user: str, **extra: Any) -> bytes:
    # Spacing and key order of the agent's own client: the gateway must pass these bytes on as they are.
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": user}]
    return json.dumps({"messages": messages, "model": model, **extra}, indent=1).encode()


async def test_forwards_unchanged_and_harvests_redacted(redis_url: str) -> None:
    cfg, router = config(), fakes()
    async with gateway(cfg, router, redis_url) as (serving, c):
        body = chat_body("a", f"my key is {SECRET}", tools=[{"type": "function", "function": {"name": "f"}}])
        resp = await c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        await serving.harvester.drain()
    upstream = router.fakes["a1"]
    assert resp.status_code == 200
    assert upstream.seen[0].body == body  # byte for byte, the unknown fields (tools) included
    assert upstream.seen[0].headers["authorization"] == AUTH["Authorization"]  # a corl server: the cohort token
    assert resp.headers["x-corl-weight-version"] == "0"
    direct = await upstream.handle(httpx.Request("POST", "http://a1/v1/chat/completions", content=body))
    assert resp.content == await direct.aread()  # the member's reply, byte for byte
    [entry] = pool(redis_url, cfg)
    assert entry.member == "a" and entry.route == "chat" and entry.redactions == 1
    assert entry.conversation.turns() == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "my key is [REDACTED]"},
    ]
    raw = b"".join(
        v for _, f in redis.Redis.from_url(redis_url).xrange(keys.harvest_pool(cfg.run_id)) for v in f.values()
    )
    assert SECRET.encode() not in raw


async def test_an_endpoint_gets_its_key_and_model_name(redis_url: str) -> None:
    cfg, router = config(), fakes()
    async with gateway(cfg, router, redis_url) as (_, c):
        by_member = await c.post("/v1/chat/completions", content=chat_body("ops", "q1"))
        by_model = await c.post("/v1/chat/completions", content=chat_body("gpt-ops", "q2"))
    ops = router.fakes["ops"]
    assert by_member.status_code == by_model.status_code == 200
    assert [json.loads(s.body)["model"] for s in ops.seen] == ["gpt-ops", "gpt-ops"]
    assert ops.seen[1].body == chat_body("gpt-ops", "q2")  # named by its own model: not touched at all
    assert {s.headers["authorization"] for s in ops.seen} == {f"Bearer {KEY}"}  # never the cohort token
    assert all(s.path == "/v1/chat/completions" for s in ops.seen)


async def test_upstream_errors_come_back_unchanged_and_are_not_harvested(redis_url: str) -> None:
    cfg, router = config(), fakes()
    router.fakes["ops"].status, router.fakes["ops"].headers = 429, {"retry-after": "7", "x-ratelimit-remaining": "0"}
    async with gateway(cfg, router, redis_url) as (serving, c):
        resp = await c.post("/v1/chat/completions", content=chat_body("ops", "q"))
        await serving.harvester.drain()
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "7" and resp.headers["x-ratelimit-remaining"] == "0"
    assert json.loads(resp.content) == {"error": {"message": "scripted", "type": "x"}}
    assert pool(redis_url, cfg) == []


async def test_the_gateway_answers_its_own_errors_in_the_one_shape(redis_url: str) -> None:
    cfg, router = config(), fakes()
    router.refused |= {"b1"}
    async with gateway(cfg, router, redis_url) as (_, c):
        no_token = await c.post("/v1/chat/completions", content=chat_body("a", "q"), headers={"Authorization": ""})
        probes = [(await c.get(p, headers={"Authorization": ""})).status_code for p in ("/healthz", "/readyz")]
        unknown = await c.post("/v1/chat/completions", content=chat_body("nobody", "q"))
        no_model = await c.post("/v1/chat/completions", content=b'{"messages": []}')
        not_json = await c.post("/v1/completions", content=b"{")
        down = await c.post("/v1/chat/completions", content=chat_body("b", "q"))
        models = ModelList.model_validate_json((await c.get("/v1/models")).content)
    assert no_token.status_code == 401 and probes == [200, 200]
    assert (unknown.status_code, ErrorResponse.model_validate_json(unknown.content).error.field) == (404, "model")
    assert (no_model.status_code, ErrorResponse.model_validate_json(no_model.content).error.field) == (422, "model")
    assert not_json.status_code == 422
    assert down.status_code == 503 and ErrorResponse.model_validate_json(down.content).error.type == "unavailable"
    assert [(m.id, m.owned_by) for m in models.data] == [("a", "corl"), ("b", "corl"), ("ops", "endpoint")]


async def test_a_replica_that_refuses_the_connection_is_skipped(redis_url: str) -> None:
    cfg, router = config(), fakes()
    router.refused |= {"a1"}
    async with gateway(cfg, router, redis_url) as (_, c):
        statuses = [
            (await c.post("/v1/chat/completions", content=chat_body("a", f"q{i}"))).status_code for i in range(6)
        ]
    assert statuses == [200] * 6 and len(router.fakes["a2"].seen) == 6


async def test_only_what_the_policy_admits_is_harvested(redis_url: str) -> None:
    policy = {"routes": ["chat"], "members": ["a", "ops"], "max_chars": 200}
    cfg, router = config(policy), fakes()
    async with gateway(cfg, router, redis_url) as (serving, c):
        sends = [
            ("/v1/chat/completions", chat_body("a", "kept")),
            ("/v1/chat/completions", chat_body("a", "kept")),  # a duplicate: stored once
            ("/v1/chat/completions", chat_body("b", "member not opted in")),
            ("/v1/completions", json.dumps({"model": "a", "prompt": "route not opted in"}).encode()),
            ("/v1/chat/completions", chat_body("ops", "x" * 300)),  # past the size bound
            ("/v1/chat/completions", chat_body("ops", "endpoint traffic")),
        ]
        statuses = [(await c.post(path, content=body)).status_code for path, body in sends]
        await serving.harvester.drain()
        stats = HarvestStats.model_validate_json((await c.get("/v1/harvest/stats")).content)
    assert statuses == [200] * 6
    assert [(e.member, e.conversation.last_user) for e in pool(redis_url, cfg)] == [
        ("a", "kept"),
        ("ops", "endpoint traffic"),
    ]
    assert stats.harvested == 2 and stats.pool == 2 and stats.redacted == 0
    assert stats.dropped == {"duplicate": 1, "too_large": 1}


async def test_sampling_and_the_pool_bound(redis_url: str) -> None:
    cfg, router = config({"sample": 0.5, "max_prompts": 40}), fakes()
    async with gateway(cfg, router, redis_url) as (serving, c):
        serving.harvester.rng = random.Random(3)
        for i in range(400):
            assert (await c.post("/v1/chat/completions", content=chat_body("b", f"q{i}"))).status_code == 200
        await serving.harvester.drain()
        stats = await serving.harvest_stats()
    assert 170 <= stats.harvested <= 230  # half of 400
    assert stats.pool == 40  # the newest max_prompts
    assert pool(redis_url, cfg)[-1].conversation.last_user in {f"q{i}" for i in range(380, 400)}
    assert len(router.fakes["b1"].seen) == 400


async def test_retention_bound(redis_url: str) -> None:
    cfg, router = config({"retention_s": 60}), fakes()
    r = redis.Redis.from_url(redis_url)
    stale = HarvestedPrompt.model_validate(
        {"id": "0" * 16, "conversation": {"messages": [{"role": "user", "content": "stale"}]}, "member": "a"}
        | {"route": "chat", "at": 1.0, "redactions": 0}
    )
    r.xadd(keys.harvest_pool(cfg.run_id), {"prompt": stale.model_dump_json()}, id="1000-0")  # harvested long ago
    async with gateway(cfg, router, redis_url) as (serving, c):
        await c.post("/v1/chat/completions", content=chat_body("a", "fresh"))
        await serving.harvester.drain()
    assert [e.conversation.last_user for e in pool(redis_url, cfg)] == ["fresh"]  # the old one trimmed by age


async def test_a_dead_pool_drops_prompts_never_requests() -> None:
    cfg, router = config(), fakes()
    dead = "redis://127.0.0.1:1/0"
    async with gateway(cfg, router, dead, redis_timeout_s=0.5) as (serving, c):
        statuses = [
            (await c.post("/v1/chat/completions", content=chat_body("a", f"q{i}"))).status_code for i in range(5)
        ]
        await serving.harvester.drain()
        metrics = (await c.get("/metrics")).text
    assert statuses == [200] * 5
    assert 'corl_gateway_prompts_dropped_total{reason="pool_down"} 5.0' in metrics


async def test_a_full_queue_drops_prompts_never_requests(redis_url: str) -> None:
    cfg, router = config(), fakes()
    async with gateway(cfg, router, redis_url, harvest_queue=2, autostart=False) as (serving, c):
        statuses = [
            (await c.post("/v1/chat/completions", content=chat_body("a", f"q{i}"))).status_code for i in range(5)
        ]
        metrics = (await c.get("/metrics")).text
        assert serving.harvester.queue.qsize() == 2
    assert statuses == [200] * 5
    assert 'corl_gateway_prompts_dropped_total{reason="queue_full"} 3.0' in metrics
    # The drops not yet in Redis ride along with the next write that succeeds.
    async with gateway(cfg, router, redis_url) as (serving, c):
        await c.post("/v1/chat/completions", content=chat_body("a", "next"))
        await serving.harvester.drain()
        stats = await serving.harvest_stats()
    assert stats.harvested == 1  # a new process: its own counts only


async def test_a_failing_redaction_hook_stores_nothing(redis_url: str) -> None:
    from corl.config import RedactConfig
    from corl.harvest import Redactor

    def hook(text: str) -> str:
        raise RuntimeError("no")

    cfg, router = config(), fakes()
    s = GatewaySettings(_env_file=None, config=Path("/x"), redis_url=redis_url)  # type: ignore[call-arg]
    app = create_app(s, config=cfg, transport=router.transport(), redactor=Redactor(RedactConfig(), hook=hook))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
            resp = await c.post("/v1/chat/completions", content=chat_body("a", SECRET))
            await app.state.harvester.drain()
            stats = await app.state.serving.harvest_stats()
    assert resp.status_code == 200 and pool(redis_url, cfg) == []
    assert stats.dropped == {"redaction_failed": 1}


async def test_harvesting_waits_for_nothing(redis_url: str) -> None:
    """A slow pool write (a hook that takes 0.3 s) does not hold the request up."""
    from corl.config import RedactConfig
    from corl.harvest import Redactor

    def slow(text: str) -> str:
        time.sleep(0.3)
        return text

    cfg, router = config(), fakes()
    s = GatewaySettings(_env_file=None, config=Path("/x"), redis_url=redis_url)  # type: ignore[call-arg]
    app = create_app(s, config=cfg, transport=router.transport(), redactor=Redactor(RedactConfig(), hook=slow))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
            t0 = time.perf_counter()
            for i in range(3):
                assert (await c.post("/v1/chat/completions", content=chat_body("a", f"q{i}"))).status_code == 200
            elapsed = time.perf_counter() - t0
            await app.state.harvester.drain()
    assert elapsed < 0.3
    assert len(pool(redis_url, cfg)) == 3


@pytest.mark.parametrize(("linger_ms", "most_writes"), [(2000.0, 2), (0.0, 8)])
async def test_requests_close_together_are_answered_before_their_pool_write(
    redis_url: str, linger_ms: float, most_writes: int
) -> None:
    """With a linger, the pool writers wait for the requests behind the first: 8 requests in a row share
    at most one write per writer (2), made after the last answer; without one, the writes come between them."""
    cfg, router = config(), fakes()
    async with gateway(cfg, router, redis_url, harvest_linger_ms=linger_ms) as (serving, c):
        writes = serving.metrics.registry.get_sample_value
        for i in range(8):
            assert (await c.post("/v1/chat/completions", content=chat_body("a", f"q{i}"))).status_code == 200
            await asyncio.sleep(0.005)  # the loop is free between requests: a writer may run
        during = writes("corl_gateway_pool_write_seconds_count") or 0.0
        await serving.harvester.drain()
        after = writes("corl_gateway_pool_write_seconds_count")
    assert len(pool(redis_url, cfg)) == 8
    if linger_ms:
        assert during == 0 and after <= most_writes
    else:
        assert during > most_writes / 4  # writes went on between the requests


def wait_pool(redis_url: str, cfg: CohortConfig, n: int, timeout_s: float = 10.0) -> list[HarvestedPrompt]:
    deadline = time.monotonic() + timeout_s
    while len(entries := pool(redis_url, cfg)) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return entries


@contextmanager
def served_gateway(cfg: CohortConfig, router: Router, redis_url: str) -> Iterator[str]:
    """The gateway under a real uvicorn (an in-process transport would buffer a stream whole)."""
    s = GatewaySettings(_env_file=None, config=Path("/x"), redis_url=redis_url, cohort_token=TOKEN)  # type: ignore[call-arg]
    with serve_app(create_app(s, config=cfg, transport=router.transport())) as url:
        yield url


async def test_streams_pass_through_as_they_arrive(redis_url: str) -> None:
    cfg, router = config(), fakes()
    gate = threading.Event()
    router.fakes["a1"].gate = router.fakes["a2"].gate = gate
    with served_gateway(cfg, router, redis_url) as url:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=10) as c:
            body = chat_body("a", "stream me", stream=True)
            async with c.stream("POST", "/v1/chat/completions", content=body) as resp:
                assert resp.headers["content-type"].startswith("text/event-stream")
                chunks = resp.aiter_raw()
                first = await asyncio.wait_for(chunks.__anext__(), 5)  # while the upstream holds the rest back
                gate.set()
                rest = b"".join([chunk async for chunk in chunks])
        entries = wait_pool(redis_url, cfg, 1)
    events = [line for line in (first + rest).decode().split("\n\n") if line]
    assert first.startswith(b"data: ") and events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:-1])
    assert text.endswith("says hi")
    assert [e.conversation.last_user for e in entries] == ["stream me"]


async def test_an_agent_that_leaves_mid_stream_closes_the_upstream(redis_url: str) -> None:
    cfg, router = config(), fakes()
    gate = threading.Event()  # never set: the upstream holds the stream after its first chunk
    router.fakes["a1"].gate = router.fakes["a2"].gate = gate
    with served_gateway(cfg, router, redis_url) as url:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=10) as c:
            async with c.stream("POST", "/v1/chat/completions", content=chat_body("a", "bye", stream=True)) as resp:
                await asyncio.wait_for(resp.aiter_raw().__anext__(), 5)
            # the agent closed its connection before the end of the reply
        deadline = time.monotonic() + 5
        while router.fakes["a1"].abandoned + router.fakes["a2"].abandoned == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        gate.set()
    assert router.fakes["a1"].abandoned + router.fakes["a2"].abandoned == 1


def test_two_agents_with_the_openai_client(redis_url: str) -> None:
    """Two scripted agents on the official client: one talks to a corl member, one to an outside endpoint,
    both through the gateway, streamed and not."""
    openai = pytest.importorskip("openai")
    cfg, router = config(), fakes()
    with served_gateway(cfg, router, redis_url) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
        system = {"role": "system", "content": "You are terse."}
        answers = []
        for model in ("a", "ops"):
            for i in range(3):
                user = {"role": "user", "content": f"{model} question {i}"}
                reply = client.chat.completions.create(model=model, messages=[system, user])
                answers.append(reply.choices[0].message.content)
                stream = client.chat.completions.create(model=model, messages=[system, user], stream=True)
                answers.append("".join(ch.choices[0].delta.content or "" for ch in stream))
        listed = [m.id for m in client.models.list()]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        entries = wait_pool(redis_url, cfg, 6)
    assert all(a and a.endswith("says hi") for a in answers)
    assert listed == ["a", "b", "ops"]
    # A streamed and an unstreamed ask of one conversation: harvested once.
    assert sorted(e.conversation.last_user for e in entries) == sorted(
        f"{m} question {i}" for m in ("a", "ops") for i in range(3)
    )
    assert {e.member for e in entries} == {"a", "ops"}


GUARDED = [
    ("POST", "/v1/chat/completions", chat_body("a", "q")),
    ("POST", "/v1/completions", json.dumps({"model": "a", "prompt": "q"}).encode()),
    ("GET", "/v1/models", None),
    ("GET", "/v1/harvest/stats", None),
]


async def test_every_route_but_the_probes_takes_the_cohort_token(redis_url: str) -> None:
    cfg, router = config(), fakes()
    async with gateway(cfg, router, redis_url) as (_, c):
        for method, path, body in GUARDED:
            for auth in ("", "Bearer wrong"):
                r = await c.request(method, path, content=body, headers={"Authorization": auth})
                assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized", (path, auth)
            assert (await c.request(method, path, content=body)).status_code == 200, path
        assert (await c.get("/metrics", headers={"Authorization": ""})).status_code == 200
    assert all(s.headers["authorization"] == AUTH["Authorization"] for f in router.fakes.values() for s in f.seen)
