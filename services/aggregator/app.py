"""Aggregator app: creation and lifespan only (clients, the serving layer, the round driver)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import redis.asyncio as aioredis
from fastapi import FastAPI

from corl.config import CohortConfig, load_config

from .errors import install_error_handlers
from .limits import BodyLimitMiddleware
from .metrics import AggregatorMetrics
from .routes import router
from .service import AggregatorService
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
        service = AggregatorService(cfg, settings, redis, http, app.state.metrics)
        try:
            await service.start(run_rounds=settings.autostart)
            app.state.service = service
            yield
        finally:
            app.state.service = None
            await service.stop()
            await http.aclose()
            await redis.aclose()

    app = FastAPI(title="corl aggregator", version="1", lifespan=lifespan)
    app.state.metrics = AggregatorMetrics()
    app.state.service = None
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.grading.max_body_bytes)
    install_error_handlers(app)
    app.include_router(router)
    return app
