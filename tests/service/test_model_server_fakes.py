"""Serving-layer behaviour with a fake backend: readiness, backend failure, timeouts, vote maths."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from corl.services.model.app import create_app
from corl.services.model.settings import ServerSettings
from corl.services.model.testing import FakeBackend


@asynccontextmanager
async def serve(backend: FakeBackend, wait: bool = True, **overrides: object) -> AsyncIterator[httpx.AsyncClient]:
    settings = ServerSettings(_env_file=None, model_dir="unused", **overrides)  # type: ignore[call-arg, arg-type]
    app = create_app(settings, backend)
    async with app.router.lifespan_context(app):
        if wait:
            await app.state.serving.wait_ready(5)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake") as c:
            yield c


GEN = {"prompts": ["1+1="], "n": 2}


async def test_not_ready_until_loaded_then_ready() -> None:
    backend = FakeBackend()
    backend.block_start = True
    async with serve(backend, wait=False) as c:
        assert (await c.get("/healthz")).status_code == 200
        for r in (await c.get("/readyz"), await c.post("/v1/generate", json=GEN), await c.get("/v1/info")):
            assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable"
        backend.loaded.set()
        await asyncio.sleep(0.05)
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.post("/v1/generate", json=GEN)).status_code == 200


async def test_failing_backend_is_503_not_500() -> None:
    async with serve(FakeBackend(fail=True)) as c:
        r = await c.post("/v1/generate", json=GEN)
        assert r.status_code == 503 and "device lost" in r.json()["error"]["message"]
        r = await c.post("/v1/grade", json={"task": "addition", "items": [{"prompt": "1+1=", "response": "2"}]})
        assert r.status_code == 503


async def test_hanging_backend_times_out_with_503() -> None:
    async with serve(FakeBackend(hang=True), request_timeout_s=0.2) as c:
        r = await asyncio.wait_for(c.post("/v1/generate", json=GEN), 5)
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable"


@pytest.mark.parametrize(
    ("response", "score"),
    [("46", 0.5), (" 46 ", 0.5), ("45", 0.25), ("44", 0.0), ("forty-six", 0.0), ("", 0.0)],
)
async def test_vote_score_is_fraction_of_own_answers_agreeing(response: str, score: float) -> None:
    # The server's own 4 votes: 46, 46, 45, unparseable.
    async with serve(FakeBackend(["46", "46", "45", "???"])) as c:
        r = await c.post(
            "/v1/grade", json={"task": "addition", "items": [{"prompt": "12+34=", "response": response}], "n_votes": 4}
        )
        assert r.status_code == 200, r.text
        assert r.json()["scores"] == [score]


async def test_judge_scores_come_from_the_backend() -> None:
    async with serve(FakeBackend()) as c:
        items = [{"prompt": "1+1=", "response": "2"}, {"prompt": "2+2=", "response": "5"}]
        r = await c.post("/v1/grade", json={"task": "addition", "items": items, "mode": "judge"})
        assert r.json() == {"model": "fake", "weight_version": 0, "scores": [0.25, 0.25]}


async def test_weights_disabled_without_admin_token() -> None:
    async with serve(FakeBackend(), admin_token=None) as c:
        body = {"version": 1, "uri": "/x", "sha256": "0" * 64}
        r = await c.post("/v1/weights", json=body, headers={"Authorization": "Bearer "})
        assert r.status_code == 401
