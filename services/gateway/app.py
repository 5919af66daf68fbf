"""Gateway app: creation and lifespan only (the upstream client, Redis, the harvester, the canary)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import redis.asyncio as aioredis
from fastapi import FastAPI

from corl.config import CohortConfig, load_config
from corl.harvest import Redactor
from corl.redis_auth import redis_auth
from corl.services.service_app import secret_value, service_app, serving_on

from .canary import CanaryController
from .harvest import Harvester
from .metrics import GatewayMetrics
from .relay import Relay
from .routes import router
from .serving import GatewayServing
from .settings import GatewaySettings
from .upstreams import Routes


def create_app(
    settings: GatewaySettings,
    *,
    config: CohortConfig | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    redactor: Redactor | None = None,
) -> FastAPI:
    """``config`` defaults to ``settings.config`` read from disk; ``transport`` replaces the network
    transport to the members (tests pass an ``httpx.MockTransport``); ``redactor`` the config's."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cfg = config or load_config(settings.config)
        metrics: GatewayMetrics = app.state.metrics
        token = secret_value(settings.cohort_token)
        routes = Routes(cfg, token)  # a missing endpoint key variable stops the start here
        # The hook is the operator's module: imported once, here, so a wrong name stops the start.
        redact = redactor if redactor is not None else await asyncio.to_thread(Redactor, cfg.gateway.harvest.redact)
        async with AsyncExitStack() as stack:
            limits = httpx.Limits(
                max_connections=settings.max_connections, max_keepalive_connections=settings.max_connections
            )
            http = httpx.AsyncClient(
                transport=transport or httpx.AsyncHTTPTransport(retries=settings.transport_retries, limits=limits),
                timeout=httpx.Timeout(settings.request_timeout_s, connect=settings.connect_timeout_s),
            )  # outside endpoints (proxies from the environment) and the canary's calls
            stack.push_async_callback(http.aclose)
            # The members' own servers, unless a test fakes every upstream with a transport.
            relay = None if transport else Relay(settings.connect_timeout_s, settings.request_timeout_s)
            if relay is not None:
                stack.push_async_callback(relay.aclose)
            redis = aioredis.Redis.from_url(
                settings.redis_url or cfg.redis_url,
                **redis_auth(),
                socket_connect_timeout=settings.redis_timeout_s,
                socket_timeout=settings.redis_timeout_s,
            )
            stack.push_async_callback(redis.aclose)
            harvester = Harvester(cfg, settings, redis, metrics, redact)
            canary = CanaryController(cfg, routes, http, redis, metrics, secret_value(settings.admin_token))
            if settings.autostart:
                harvester.start()
                canary.start()
            stack.push_async_callback(harvester.stop)
            stack.push_async_callback(canary.stop)
            serving = GatewayServing(cfg, http, relay, routes, harvester, metrics, settings.attempts)
            app.state.harvester, app.state.canary = harvester, canary
            async with serving_on(app, serving):
                yield

    return service_app(
        "corl gateway",
        lifespan,
        GatewayMetrics(),
        [router],
        settings,
        summary="OpenAI-compatible: forwards an agent app's calls to the cohort's members and harvests them.",
        cohort_token=secret_value(settings.cohort_token),
    )
