"""Aggregator app: creation and lifespan only (clients, the serving layer, the round driver)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import redis.asyncio as aioredis
from fastapi import FastAPI

from corl.config import CohortConfig, load_config
from corl.proto import CONTRACT_VERSION
from corl.services.http import install_edge

from .metrics import AggregatorMetrics
from .routes import router
from .serving import AggregatorServing
from .settings import AggregatorSettings


def create_app(
    settings: AggregatorSettings,
    *,
    config: CohortConfig | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """``config`` defaults to ``settings.config`` read from disk; ``transport`` replaces the network
    transport of the shared HTTP client (tests pass an ``httpx.MockTransport``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cfg = config or load_config(settings.config)
        hs = settings.http
        http = httpx.AsyncClient(
            transport=transport or httpx.AsyncHTTPTransport(retries=hs.transport_retries),
            timeout=httpx.Timeout(cfg.rounds.request_timeout_s, connect=hs.connect_timeout_s),
            limits=httpx.Limits(max_connections=hs.max_connections),
        )
        redis = aioredis.Redis.from_url(
            settings.redis_url or cfg.redis_url,
            socket_connect_timeout=5.0,
            socket_timeout=settings.redis_timeout_s,
            health_check_interval=30,
        )
        serving = AggregatorServing(cfg, settings, redis, http, app.state.metrics)
        try:
            await serving.start(run_rounds=settings.autostart)
            app.state.serving = serving
            yield
        finally:
            app.state.serving = None
            await serving.stop()
            await http.aclose()
            await redis.aclose()

    app = FastAPI(title="corl aggregator", version=CONTRACT_VERSION, lifespan=lifespan)
    app.state.metrics = AggregatorMetrics()
    app.state.admin_token = settings.admin_token.get_secret_value() if settings.admin_token else None
    app.state.serving = None
    app.include_router(router)
    # Outside trainers post a whole rollout batch to the reward routes: they have their own bound.
    batch_limit = settings.reward_server.max_body_bytes
    install_edge(
        app,
        metrics=app.state.metrics.http,
        max_body_bytes=settings.grading.max_body_bytes,
        path_limits={"/get_reward": batch_limit, "/v1/reward": batch_limit},
    )
    return app
