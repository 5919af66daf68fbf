"""The reward server on a real (tiny, randomly initialised) model server: the generate calls it makes
are ones a real member accepts, and a response equal to the cohort's consensus gets reward 1."""

from __future__ import annotations

from typing import Any

import httpx
from test_aggregator import ADMIN, make_config

from corl.proto import OpenRLHFRewardResponse, SlimeRewardResponse
from corl.services.aggregator import AggregatorSettings, create_app


async def test_reward_routes_on_a_tiny_real_member(redis_url: str, model_app: Any) -> None:
    # Both members are served by the same tiny model app (in-process); each samples with its own seed.
    cfg = make_config(["a", "b"], samples_per_prompt=6)
    settings = AggregatorSettings(
        config="/nonexistent.yaml",  # type: ignore[arg-type]
        redis_url=redis_url,
        admin_token=ADMIN,
        autostart=False,
        reward_server={"enabled": True},  # type: ignore[arg-type]
    )
    app = create_app(settings, config=cfg, transport=httpx.ASGITransport(app=model_app))
    body = {"query": ["12+34=46", "12+34=7"], "prompts": ["12+34=", "12+34="], "labels": ["46", "46"]}
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agg") as c:
            r = await c.post("/get_reward", json=body)
            assert r.status_code == 200, r.text
            got = OpenRLHFRewardResponse.model_validate(r.json())
            one = await c.post("/v1/reward", json={"prompt": "12+34=", "response": "46"})
            consensus = SlimeRewardResponse.model_validate(one.json()).consensus
            if consensus is not None:
                agreeing = await c.post("/v1/reward", json={"prompt": "12+34=", "response": consensus})
                assert agreeing.json()["reward"] == 1.0
    assert len(got.rewards) == 2 and set(got.rewards) <= {0.0, 1.0}
    assert all(0.0 <= s <= 1.0 for s in got.scores)
    assert got.weight_versions == {"a": 0, "b": 0}
