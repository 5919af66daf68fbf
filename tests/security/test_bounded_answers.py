"""Reading an answer is bounded in time: a hostile (or unlucky) math answer is no answer after the
budget, read in a worker process so that the service reading it keeps answering."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from corl.services.model.app import create_app
from corl.services.model.settings import ServerSettings
from corl.services.model.testing import FakeBackend
from corl.tasks import Example, bounded, get_task

pytestmark = pytest.mark.security

HOSTILE = ["\\boxed{2^{2^{20}}}", "\\boxed{10^{10^{7}}}"]


@pytest.fixture(scope="module", autouse=True)
def _warm_workers() -> None:
    bounded.warm()


@pytest.mark.parametrize("answer", HOSTILE)
def test_a_hostile_answer_is_no_answer_within_the_budget(answer: str) -> None:
    task = get_task("math")
    t0 = time.monotonic()
    assert task.extract_answer("q", answer) is None
    assert not task.is_correct(Example("q", "4"), answer)
    assert time.monotonic() - t0 < 2 * bounded.BUDGET_S + 1.0
    # The workers are replaced: ordinary answers still read, at once.
    assert task.extract_answer("q", "So\n#### 3 + 2\\sqrt{2}") == "2*sqrt(2) + 3"


async def test_the_model_server_answers_within_3s_and_stays_ready_meanwhile() -> None:
    settings = ServerSettings(_env_file=None, model_dir="unused")  # type: ignore[call-arg]
    app = create_app(settings, FakeBackend())
    body = {"task": "math", "items": [{"prompt": "What is 2+2?", "response": HOSTILE[0]}]}
    async with app.router.lifespan_context(app):
        await app.state.serving.wait_ready(5)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake") as c:
            t0 = time.monotonic()
            grade = asyncio.create_task(c.post("/v1/grade", json=body))
            probes = []
            while not grade.done():
                p0 = time.monotonic()
                assert (await c.get("/readyz")).status_code == 200
                probes.append(time.monotonic() - p0)
                await asyncio.sleep(0.05)
            r = await grade
            elapsed = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["scores"] == [0.0]  # read as no answer: no agreement
    assert elapsed < 3.0 and probes and max(probes) < 0.1
