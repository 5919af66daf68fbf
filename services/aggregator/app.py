"""Aggregator app: creation and lifespan only (clients, the serving layer, the round driver)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from corl.config import CohortConfig, load_config
from corl.redis_auth import redis_auth
from corl.sandbox import require_sandbox
from corl.services.http import error_response
from corl.services.service_app import secret_value, service_app, serving_on
from corl.tasks import bounded, get_task
from corl.tracking import build_tracking

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
        task = get_task(cfg.task.name)
        if task.runs_code:  # fail closed before serving: no jail, no code task
            await asyncio.to_thread(require_sandbox)
        if task.name == "math":  # symbolic answers are read in worker processes: start them now
            await asyncio.to_thread(bounded.warm)
        hs = settings.http
        http = httpx.AsyncClient(
            transport=transport or httpx.AsyncHTTPTransport(retries=hs.transport_retries),
            timeout=httpx.Timeout(cfg.rounds.request_timeout_s, connect=hs.connect_timeout_s),
            limits=httpx.Limits(max_connections=hs.max_connections),
        )
        redis_url = settings.redis_url or cfg.redis_url
        redis = aioredis.Redis.from_url(
            redis_url,
            **redis_auth(),
            socket_connect_timeout=5.0,
            socket_timeout=settings.redis_timeout_s,
            health_check_interval=30,
        )
        # Round stats go to the experiment trackers (tracking.report_to) from threads of their own.
        tracking = build_tracking(cfg, "aggregator", app.state.metrics.registry, redis_url=redis_url)
        serving = AggregatorServing(cfg, settings, redis, http, app.state.metrics, tracking)
        try:
            await serving.start(run_rounds=settings.autostart)
            async with serving_on(app, serving):
                yield
        finally:
            await serving.stop()
            await asyncio.to_thread(tracking.close)  # flushing may wait on a tracker: not on the event loop
            await http.aclose()
            await redis.aclose()

    # Outside trainers post a whole rollout batch to the reward routes: they have their own bound.
    batch_limit = settings.reward_server.max_body_bytes
    app = service_app(
        "corl aggregator",
        lifespan,
        AggregatorMetrics(),
        [router],
        settings.grading,
        path_limits={"/get_reward": batch_limit, "/v1/reward": batch_limit},
        admin_token=secret_value(settings.admin_token),
        reward_server=settings.reward_server,
    )
    for exc in (RedisConnectionError, RedisTimeoutError):
        app.add_exception_handler(exc, _redis_unavailable)
    return app


async def _redis_unavailable(_: Request, exc: Exception) -> JSONResponse:
    """Redis down or restarting is a transient 503 (clients retry), not an internal error."""
    return error_response(503, "unavailable", f"redis unavailable: {type(exc).__name__}", headers={"Retry-After": "1"})
