"""The model server app: creation and lifespan only (routes in ``routes``, logic in ``serving``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from corl.proto import CONTRACT_VERSION
from corl.services.http import install_edge

from .backends import create_backend
from .backends.base import Backend
from .metrics import ServerMetrics
from .openai_routes import router as openai_router
from .openai_serving import OpenAIServing
from .openapi import publish_bounds
from .routes import router
from .serving import ModelServing
from .settings import ServerSettings

log = logging.getLogger(__name__)


def _build_backend(settings: ServerSettings) -> Backend:
    if not settings.model_dir:
        raise ValueError("no model directory: pass --model or set CORL_MODEL_DIR")
    options: dict[str, object] = {}
    if settings.backend == "transformers":
        options["device"] = settings.device
        if settings.num_threads:
            options["num_threads"] = settings.num_threads
    else:
        options["options"] = settings.vllm
    return create_backend(
        settings.backend,
        model_dir=settings.model_dir,
        name=settings.member_name,
        initial_version=settings.initial_weight_version,
        **options,
    )


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: ServerSettings = app.state.settings
    backend = app.state.backend_override or _build_backend(settings)
    serving = ModelServing(settings, backend, app.state.metrics)
    app.state.serving = serving
    app.state.openai = OpenAIServing(serving)
    # Load in the background: /healthz answers at once and /readyz says 503 until the model is in.
    loading = asyncio.create_task(serving.start(), name="corl-model-load")
    try:
        yield
    finally:
        loading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await loading
        await serving.close()
        app.state.serving = app.state.openai = None


def create_app(settings: ServerSettings | None = None, backend: Backend | None = None) -> FastAPI:
    """Build the app; nothing is loaded until its lifespan starts (so the OpenAPI document can be
    produced without a model). ``backend`` replaces the one ``settings`` would build (tests)."""
    settings = settings or ServerSettings()
    app = FastAPI(
        title="corl model server",
        version=CONTRACT_VERSION,
        summary="One cohort member: sampling with log-probs, peer grading, hot weight swaps.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.admin_token = settings.admin_token.get_secret_value() if settings.admin_token else None
    app.state.cohort_token = settings.cohort_token.get_secret_value() if settings.cohort_token else None
    app.state.metrics = ServerMetrics()
    app.state.backend_override = backend
    app.state.serving = app.state.openai = None
    app.include_router(router)
    app.include_router(openai_router)
    install_edge(
        app,
        metrics=app.state.metrics.http,
        max_body_bytes=settings.max_body_bytes,
        max_client_concurrency=settings.max_client_concurrency,
    )
    publish_bounds(app, settings)
    return app
