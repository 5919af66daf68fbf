"""The cohort token: with ``CORL_COHORT_TOKEN`` set, a model server's generate, grade and OpenAI routes
and the evaluator's readings answer 401 without it; the corl clients send it (and never to an outside
endpoint)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from corl.services.model.app import create_app
from corl.services.model.settings import ServerSettings
from corl.services.model.testing import FakeBackend

pytestmark = pytest.mark.security

TOKEN = "cohort-secret"
GUARDED = [
    ("POST", "/v1/generate", {"prompts": ["1+1="], "n": 1}),
    ("POST", "/v1/grade", {"task": "addition", "items": [{"prompt": "1+1=", "response": "2"}]}),
    ("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/completions", {"model": "m", "prompt": "hi"}),
    ("GET", "/v1/models", None),
]


@asynccontextmanager
async def serve(**overrides: object) -> AsyncIterator[httpx.AsyncClient]:
    settings = ServerSettings(_env_file=None, model_dir="unused", **overrides)  # type: ignore[call-arg, arg-type]
    app = create_app(settings, FakeBackend())
    async with app.router.lifespan_context(app):
        await app.state.serving.wait_ready(5)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake") as c:
            yield c


@pytest.mark.parametrize(("method", "path", "body"), GUARDED, ids=[p for _, p, _ in GUARDED])
async def test_guarded_routes_need_the_cohort_token(method: str, path: str, body: dict | None) -> None:
    async with serve(cohort_token=TOKEN) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = await c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
        r = await c.request(method, path, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code != 401
        assert (await c.get("/readyz")).status_code == 200  # probes stay open
        assert (await c.get("/v1/info")).status_code == 200


async def test_a_server_without_a_token_stays_open() -> None:
    async with serve() as c:
        assert (await c.post("/v1/generate", json=GUARDED[0][2])).status_code == 200


async def test_the_aggregator_sends_the_token_to_corl_members_only() -> None:
    from corl.config import MemberConfig
    from corl.proto import GenerateRequest, SamplingSettings
    from corl.services.aggregator.members import MemberClient
    from corl.services.aggregator.settings import HttpSettings

    seen: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        sample = {"text": "2", "token_ids": [1], "logprobs": [0.0], "finish_reason": "stop"}
        results = [{"prompt": "q", "prompt_token_ids": [1], "samples": [sample]}]
        return httpx.Response(200, json={"model": "m", "weight_version": 0, "results": results})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        client = MemberClient(http, HttpSettings(), 5.0, cohort_token=TOKEN)
        member = MemberConfig(name="a", model="a", servers=["http://a"])
        sp = SamplingSettings(temperature=0.0, top_p=1.0, max_tokens=4, stop=[])
        await client.generate(member, GenerateRequest.of(["q"], sp, n=1))
    assert seen == [f"Bearer {TOKEN}"]


async def test_a_server_grades_only_the_tasks_it_serves() -> None:
    item = {"items": [{"prompt": "01+01=", "response": "2"}]}
    async with serve() as c:  # unset: every task but code
        assert (await c.post("/v1/grade", json={"task": "addition", **item})).status_code == 200
        r = await c.post("/v1/grade", json={"task": "code", **item})
        assert r.status_code == 403 and r.json()["error"]["field"] == "task"
    async with serve(tasks="math") as c:  # CORL_TASKS=math, as corl run sets the run's task
        r = await c.post("/v1/grade", json={"task": "addition", **item})
        assert r.status_code == 403 and "['math']" in r.json()["error"]["message"]


async def test_one_call_decodes_a_bounded_number_of_sequences() -> None:
    async with serve(max_rows=64) as c:
        r = await c.post("/v1/generate", json={"prompts": ["1+1="] * 16, "n": 8})
        assert r.status_code == 422 and "128 sequences" in r.json()["error"]["message"]
        assert (await c.post("/v1/generate", json={"prompts": ["1+1="] * 8, "n": 8})).status_code == 200
