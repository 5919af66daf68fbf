"""Evaluator app: creation and lifespan only (the clients, the reader, the polling thread)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import redis
from fastapi import FastAPI

from corl.config import CohortConfig, load_config
from corl.heldout import HeldoutReader, client_timeout
from corl.redis_auth import redis_auth
from corl.services.http import EdgeBounds, bearer_headers
from corl.services.service_app import secret_value, service_app, serving_on
from corl.tracking import build_tracking

from .metrics import EvaluatorMetrics
from .routes import router
from .serving import EvaluatorServing
from .settings import EvaluatorSettings

MAX_BODY_BYTES = 16 * 1024  # no route takes a body


def create_app(
    settings: EvaluatorSettings,
    *,
    config: CohortConfig | None = None,
    transport: httpx.BaseTransport | None = None,
) -> FastAPI:
    """``config`` defaults to ``settings.config`` read from disk; ``transport`` replaces the network
    transport of the member client (tests pass an ``httpx.MockTransport``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cfg = config or load_config(settings.config)
        token = secret_value(settings.cohort_token)
        async with AsyncExitStack() as stack:
            # Synchronous clients: every call is made from the polling thread.
            http = stack.enter_context(
                httpx.Client(
                    transport=transport or httpx.HTTPTransport(retries=settings.transport_retries),
                    timeout=client_timeout(cfg, settings.connect_timeout_s),
                    headers=bearer_headers(token),  # only the members' servers are called with it
                )
            )
            redis_url = settings.redis_url or cfg.redis_url
            client = redis.Redis.from_url(
                redis_url, **redis_auth(), socket_connect_timeout=5.0, socket_timeout=settings.redis_timeout_s
            )
            stack.callback(client.close)
            reader = await asyncio.to_thread(HeldoutReader, cfg, http, settings.eval_prompts)  # reads the data set
            if not reader.examples:
                raise ValueError(f"task {cfg.task.name!r} holds no problems out (task.eval_size: 0): nothing to read")
            tracking = build_tracking(cfg, "evaluator", app.state.metrics.registry, redis_url=redis_url)
            stack.push_async_callback(asyncio.to_thread, tracking.close)  # flushing may wait on a tracker
            serving = EvaluatorServing(cfg, settings, reader, client, app.state.metrics, tracking)
            stack.push_async_callback(serving.stop)
            await serving.start(poll=settings.autostart)
            async with serving_on(app, serving):
                yield

    return service_app(
        "corl evaluator",
        lifespan,
        EvaluatorMetrics(),
        [router],
        EdgeBounds(max_body_bytes=MAX_BODY_BYTES),
        cohort_token=secret_value(settings.cohort_token),
    )
