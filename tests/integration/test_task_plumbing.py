"""The task is configured once, in the cohort config, and reaches every model server through the
requests: a non-addition run renders prompts and judge texts the task's way on each member (its own
chat template, or the plain template), and the graded batches carry the run's sampling settings."""

from __future__ import annotations

import contextlib
from typing import Any

import httpx
import redis

from corl import redis_keys as keys
from corl.config import parse_config
from corl.models.tokenizer import build_char_tokenizer
from corl.proto import GradedBatch
from corl.services.aggregator import AggregatorSettings
from corl.services.aggregator import create_app as create_aggregator
from corl.services.model.app import create_app as create_server
from corl.services.model.rendering import PromptRenderer
from corl.services.model.settings import ServerSettings
from corl.services.model.testing import FakeBackend
from corl.tasks import get_task

ADMIN = {"Authorization": "Bearer admin"}
PROMPTS = ["Tom has 3 apples and gets 1 more. How many apples?", "What is 2 + 2?"]
ANSWER = "2 + 2 = 4. The answer is 4."


class RouterTransport(httpx.AsyncBaseTransport):
    """Routes each request by host to an in-process app."""

    def __init__(self, apps: dict[str, Any]) -> None:
        self._by_host = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._by_host[request.url.host].handle_async_request(request)


async def test_math_run_renders_prompts_and_judge_texts_the_tasks_way_on_each_member(redis_url: str) -> None:
    chat_tok = build_char_tokenizer()
    chat_tok.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "
    backends = {
        "chatty": FakeBackend(name="chatty", tokenizer=chat_tok, answer=lambda _: ANSWER),
        "plain": FakeBackend(name="plain", tokenizer=build_char_tokenizer(), answer=lambda _: ANSWER),
    }
    servers = {
        f"{n}.member": create_server(ServerSettings(_env_file=None, model_dir="unused", name=n), b)  # type: ignore[call-arg]
        for n, b in backends.items()
    }
    cfg = parse_config(
        {
            "run_id": "task-plumbing",
            "task": "math",
            "members": [{"name": n, "model": "unused", "servers": [f"http://{n}.member"]} for n in backends],
            "rounds": {
                "prompts_per_round": 2,
                "samples_per_prompt": 2,
                "max_tokens": 64,
                "top_p": 0.9,
                "prompt_source": {"kind": "http"},
                "max_pending_batches": 100,
            },
            "reward": {"mode": "peer_judge", "judge": {"k": 1}},
        }
    )
    settings = AggregatorSettings(config="unused.yaml", redis_url=redis_url, admin_token="admin", autostart=False)  # type: ignore[arg-type]
    aggregator = create_aggregator(settings, config=cfg, transport=RouterTransport(servers))
    async with contextlib.AsyncExitStack() as stack:
        for app in servers.values():
            await stack.enter_async_context(app.router.lifespan_context(app))
            await app.state.serving.wait_ready(5)
        await stack.enter_async_context(aggregator.router.lifespan_context(aggregator))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=aggregator), base_url="http://aggregator")
        )
        posted = await client.post("/v1/prompts", json={"prompts": [{"prompt": p} for p in PROMPTS]}, headers=ADMIN)
        assert posted.status_code == 200
        result = await aggregator.state.serving.driver.run_round()
    assert (result.status, result.written) == ("ok", ["chatty", "plain"])

    task = get_task("math")
    fmt = task.prompt_format
    for backend in backends.values():
        render = PromptRenderer(backend.tokenizer).render
        # Each member rendered the task text with its own template ...
        assert backend.generated == [render(p, fmt) for p in PROMPTS]
        # ... and judged its peer's responses (k=1: each member grades the other) with the task's
        # judge text, rendered the same way; no member judged its own samples.
        assert backend.judged == [render(task.judge_prompt(p, ANSWER), fmt) for p in PROMPTS for _ in range(2)]
    assert backends["chatty"].generated[0].startswith("[system]" if fmt.system else "[user]")
    assert not backends["plain"].generated[0].startswith("[")

    r: Any = redis.Redis.from_url(redis_url)
    (_, fields), *_ = r.xrange(keys.batches_stream(cfg.run_id, "plain"))
    batch = GradedBatch.model_validate_json(fields[b"batch"])
    assert batch.sampling == cfg.sampling() and batch.sampling.top_p == 0.9 and batch.sampling.max_tokens == 64
    assert [g.prompt for g in batch.groups] == PROMPTS
    assert {s.answer for _, s in batch.samples()} == {"4"}
