"""What every service's app shares: its creation (the contract's version, a per-app metrics registry,
its routes and the HTTP edge), the serving layer's place on ``app.state`` and how routes reach it,
and the plain value of an optional token setting. Each ``app.py`` adds only its own lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

from fastapi import APIRouter, FastAPI, Request
from pydantic import SecretStr

from corl.proto import CONTRACT_VERSION

from .errors import UnavailableError
from .http import EdgeLimits, HttpMetrics, install_edge


class ServiceMetrics(Protocol):
    @property
    def http(self) -> HttpMetrics: ...


def service_app(
    title: str,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]],
    metrics: ServiceMetrics,
    routers: list[APIRouter],
    limits: EdgeLimits,
    *,
    summary: str | None = None,
    path_limits: dict[str, int] | None = None,
    **state: Any,
) -> FastAPI:
    """The app of one service: ``metrics`` and ``state`` (tokens, settings) on ``app.state``, its serving
    layer None until the lifespan builds it, ``routers`` included, the edge (``install_edge``) around it."""
    app = FastAPI(title=title, version=CONTRACT_VERSION, summary=summary, lifespan=lifespan)
    app.state.metrics = metrics
    app.state.serving = None
    for name, value in state.items():
        setattr(app.state, name, value)
    for router in routers:
        app.include_router(router)
    install_edge(app, metrics=metrics.http, limits=limits, path_limits=path_limits)
    return app


@asynccontextmanager
async def serving_on(app: FastAPI, serving: object) -> AsyncIterator[None]:
    """``serving`` as the app's serving layer while the block runs (routes answer 503 before and after)."""
    app.state.serving = serving
    try:
        yield
    finally:
        app.state.serving = None


def started(request: Request, service: str, name: str = "serving") -> Any:
    """The app-state object ``name`` (a serving layer), or 503 while ``service`` is still starting."""
    value = getattr(request.app.state, name, None)
    if value is None:
        raise UnavailableError(f"{service} is starting")
    return value


def secret_value(secret: SecretStr | None) -> str | None:
    """The plain value of an optional token setting (None: unset, the check it guards is off)."""
    return secret.get_secret_value() if secret else None
