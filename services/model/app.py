"""The model server app: creation and lifespan only (routes in ``routes``, logic in ``serving``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from corl.services.service_app import secret_value, service_app

from .backends import create_backend
from .backends.base import Backend
from .metrics import ServerMetrics
from .openai_routes import router as openai_router
from .openai_serving import OpenAIServing
from .openapi import publish_bounds
from .routes import router
from .serving import ModelServing
from .settings import ServerSettings
from .transfer import WeightTransferServing

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
    app.state.transfer = WeightTransferServing(serving)
    # Load in the background: /healthz answers at once and /readyz says 503 until the model is in.
    loading = asyncio.create_task(serving.start(), name="corl-model-load")
    try:
        yield
    finally:
        loading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await loading
        await serving.close()
        app.state.serving = app.state.openai = app.state.transfer = None


def create_app(settings: ServerSettings | None = None, backend: Backend | None = None) -> FastAPI:
    """Build the app; nothing is loaded until its lifespan starts (so the OpenAPI document can be
    produced without a model). ``backend`` replaces the one ``settings`` would build (tests)."""
    settings = settings or ServerSettings()
    app = service_app(
        "corl model server",
        lifespan,
        ServerMetrics(),
        [router, openai_router],
        settings,
        summary="One cohort member: sampling with log-probs, peer grading, hot weight swaps.",
        settings=settings,
        admin_token=secret_value(settings.admin_token),
        cohort_token=secret_value(settings.cohort_token),
        backend_override=backend,
        openai=None,
        transfer=None,
    )
    publish_bounds(app, settings)
    return app
