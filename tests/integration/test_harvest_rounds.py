"""Training on harvested prompts: the gateway fills the run's prompt pool, the aggregator's rounds take
the newest conversations from it (``rounds.prompt_source: {kind: harvest}``), every member answers
them as conversations, and the free-form ``chat`` task is judged by the peers against the config's
rubric. In-process services, fake members (``FakeCohort``, ``FakeUpstream``), a real Redis."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import redis
import redis.asyncio
from test_aggregator import ROUND_DEFAULTS, aggregator

from corl import redis_keys as keys
from corl.config import CohortConfig, parse_config
from corl.proto import GenerateRequest, GradeRequest, RunStats
from corl.proto.conversation import Conversation
from corl.proto.gateway import HarvestedPrompt
from corl.services.aggregator.testing import FakeCohort
from corl.services.gateway import GatewaySettings
from corl.services.gateway import create_app as create_gateway
from corl.services.gateway.testing import FakeUpstream

_runs = itertools.count()
RUBRIC = "Answer in one word, and only if sure."


def config(reward: str = "peer_pool", **source: Any) -> CohortConfig:
    return parse_config(
        {
            "run_id": f"hv-{next(_runs)}",
            "task": {"name": "chat", "rubric": RUBRIC},
            "members": [{"name": n, "model": "unused", "servers": [FakeCohort.url(n)]} for n in ("a", "b", "c")],
            "rounds": {**ROUND_DEFAULTS, "prompt_source": {"kind": "harvest", **source}, "max_tokens": 16},
            "reward": {"mode": reward, "judge": {"k": 2}},
            "gateway": {"harvest": {"redact": {"patterns": [r"\b\d{4}-\d{4}\b"]}}},
        }
    )


class Recording:
    """The fake cohort's transport, keeping every generate and grade request the members got."""

    def __init__(self, cohort: FakeCohort) -> None:
        self.cohort = cohort
        self.generate: list[GenerateRequest] = []
        self.grade: list[GradeRequest] = []

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/generate":
            self.generate.append(GenerateRequest.model_validate_json(request.content))
        elif request.url.path == "/v1/grade":
            self.grade.append(GradeRequest.model_validate_json(request.content))
        return await self.cohort.handle(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


async def harvest(cfg: CohortConfig, redis_url: str, users: list[str]) -> None:
    """Agent traffic through an in-process gateway; returns once every prompt is in the pool."""
    fake = FakeUpstream("member")
    s = GatewaySettings(_env_file=None, config=Path("/x"), redis_url=redis_url)  # type: ignore[call-arg]
    app = create_gateway(s, config=cfg, transport=fake.transport())
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            for u in users:
                messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": u}]
                resp = await c.post("/v1/chat/completions", json={"model": "a", "messages": messages})
                assert resp.status_code == 200
        await app.state.harvester.drain()


def pooled(redis_url: str, cfg: CohortConfig) -> list[HarvestedPrompt]:
    r = redis.Redis.from_url(redis_url)
    return [HarvestedPrompt.model_validate_json(f[b"prompt"]) for _, f in r.xrange(keys.harvest_pool(cfg.run_id))]


async def test_rounds_take_the_newest_harvested_conversations(redis_url: str) -> None:
    cfg = config()
    users = ["q0", "q1", "card 1234-5678 q2", "q3", "q4"]
    await harvest(cfg, redis_url, users)
    entries = pooled(redis_url, cfg)
    assert len(entries) == 5
    rec = Recording(FakeCohort.of("a", "b", "c"))
    async with aggregator(cfg, rec, redis_url) as (serving, client):  # type: ignore[arg-type]
        first = await serving.driver.run_round()
        nothing = await serving.driver.run_round()
        await harvest(cfg, redis_url, ["q5", "q6"])
        second = await serving.driver.run_round()
        stats = RunStats.model_validate_json((await client.get(f"/v1/runs/{cfg.run_id}/stats")).content)
    assert (first.status, nothing.status, second.status) == ("ok", "no_prompts", "ok")
    newest = entries[1:]  # prompts_per_round 4: the oldest one is passed over
    prompts_asked = [req.prompts for req in rec.generate]
    assert prompts_asked[:3] == [[e.conversation.encode() for e in newest]] * 3  # every member, the same prompts
    assert all(req.format.conversation and req.format.chat for req in rec.generate)
    asked = [Conversation.decode(p) for p in rec.generate[0].prompts]
    assert [c.last_user for c in asked] == [e.conversation.last_user for e in newest]  # in the pool's order
    assert {c.last_user for c in asked} | {entries[0].conversation.last_user} == {
        *users[:2],
        "card [REDACTED] q2",
        *users[3:],
    }
    assert all(c.system == "Be brief." for c in asked)
    assert [r.harvested for r in stats.rounds] == [[e.id for e in newest], [e.id for e in pooled(redis_url, cfg)[5:]]]
    assert stats.harvest is not None
    assert stats.harvest.harvested == 7 and stats.harvest.redacted == 1 and stats.harvest.trained_on == 6


async def test_a_round_waits_for_min_prompts(redis_url: str) -> None:
    cfg = config(min_prompts=3)
    await harvest(cfg, redis_url, ["q0", "q1"])
    async with aggregator(cfg, FakeCohort.of("a", "b", "c"), redis_url) as (serving, _):
        assert (await serving.driver.run_round()).status == "no_prompts"
        await harvest(cfg, redis_url, ["q2"])
        assert (await serving.driver.run_round()).status == "ok"


async def test_peer_judge_reads_the_rubric(redis_url: str) -> None:
    cfg = config("peer_judge")
    await harvest(cfg, redis_url, ["What is the capital of France?", "Name a prime."])
    rec = Recording(FakeCohort.of("a", "b", "c"))
    async with aggregator(cfg, rec, redis_url) as (serving, _):  # type: ignore[arg-type]
        res = await serving.driver.run_round()
    assert res.status == "ok" and sorted(res.written) == ["a", "b", "c"]
    assert rec.grade and all(g.mode == "judge" and g.task == "chat" and g.rubric == RUBRIC for g in rec.grade)
    assert {it.prompt for g in rec.grade for it in g.items} == {e.conversation.encode() for e in pooled(redis_url, cfg)}


def test_conversation_prompts_reach_the_model_server(tiny_model_dir: Path) -> None:
    """A real model server renders a conversation prompt (422 for a plain text in a conversation-format
    request, never a 500) and judges it against the request's rubric."""
    from corl.services.model.settings import ServerSettings
    from corl.services.model.testing import FakeBackend, running_server

    conv = json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "12+34="}]})
    fmt = {"chat": True, "conversation": True}
    settings = ServerSettings(_env_file=None, model_dir=str(tiny_model_dir), name="tiny", num_threads=1)  # type: ignore[call-arg]
    with running_server(settings) as url:
        ok = httpx.post(f"{url}/v1/generate", json={"prompts": [conv], "n": 2, "max_tokens": 4, "format": fmt})
        bad = httpx.post(f"{url}/v1/generate", json={"prompts": ["plain"], "max_tokens": 4, "format": fmt})
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["results"][0]["samples"]) == 2
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "prompts"
    backend = FakeBackend(name="judge")
    with running_server(ServerSettings(_env_file=None, name="judge"), backend) as url:  # type: ignore[call-arg]
        grade = {"items": [{"prompt": conv, "response": "46"}], "task": "chat", "mode": "judge", "format": fmt}
        judged = httpx.post(f"{url}/v1/grade", json=grade | {"rubric": RUBRIC})
        wrong = httpx.post(f"{url}/v1/grade", json=grade | {"task": "addition", "format": {}, "rubric": "r"})
    assert judged.status_code == 200, judged.text
    [text] = backend.judged
    assert text.startswith(f"Rubric: {RUBRIC}") and "user: 12+34=" in text  # plain: not a conversation
    assert wrong.status_code == 422 and wrong.json()["error"]["field"] == "rubric"


def test_plain_prompts_of_a_chat_run_become_user_turns(tmp_path: Path) -> None:
    from corl.services.aggregator.prompts import build_prompt_source

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "hi"}\n')
    cfg = parse_config(
        {
            "task": "chat",
            "members": [{"name": n, "model": "unused", "servers": [FakeCohort.url(n)]} for n in ("a", "b")],
            "rounds": {"prompt_source": {"kind": "jsonl", "path": str(path)}},
        }
    )
    source = build_prompt_source(cfg, redis.asyncio.Redis())
    [example] = source._examples  # type: ignore[attr-defined]  # noqa: SLF001
    assert Conversation.decode(example.prompt).turns() == [{"role": "user", "content": "hi"}]
