"""The sandbox service: the one place untrusted programs run, where other services' hosts refuse the jail.

It holds no secrets but its own token, no data volume and (compose, Helm) no egress. It refuses to
start unless its jail is in force here (``SandboxUnavailable``: fail closed), or the operator allowed
the bare launcher (``CORL_SANDBOX_ALLOW_INSECURE``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.security import HTTPBearer

from corl.proto import RunProgramRequest, RunProgramResponse
from corl.sandbox import Limits, protections
from corl.sandbox.jail import require
from corl.services.http import Credentials, bearer_token, check_token, error_responses, operational_routes
from corl.services.service_app import secret_value, service_app, serving_on, started

from .serving import SandboxMetrics, SandboxServing
from .settings import SandboxSettings

log = logging.getLogger(__name__)
router = APIRouter()
sandbox_bearer = HTTPBearer(
    auto_error=False, scheme_name="sandbox", description="The sandbox service's token (CORL_SANDBOX_TOKEN)."
)


async def get_serving(request: Request) -> SandboxServing:
    return started(request, "the sandbox service")


async def require_token(request: Request, credentials: Annotated[Credentials, Depends(sandbox_bearer)]) -> None:
    expected: str | None = request.app.state.token
    if expected:
        check_token(bearer_token(credentials), expected, "sandbox")


router.include_router(operational_routes(get_serving))


@router.post("/v1/run", responses=error_responses(401, 413, 422, 503), dependencies=[Depends(require_token)])
async def run(body: RunProgramRequest, serving: Annotated[SandboxServing, Depends(get_serving)]) -> RunProgramResponse:
    """Run one program in this service's jail and report how it ended; what the program does never
    fails the request."""
    return await serving.run(body)


def create_app(settings: SandboxSettings | None = None) -> FastAPI:
    settings = settings or SandboxSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Its own jail, whatever CORL_SANDBOX_URL says: none here, and it refuses to start, naming what is missing.
        await asyncio.to_thread(require, Limits().uid)
        log.info("sandbox protections: %s", await asyncio.to_thread(protections, None, True))
        async with serving_on(app, SandboxServing(settings, app.state.metrics)):
            yield

    token = secret_value(settings.token)
    return service_app("corl sandbox", lifespan, SandboxMetrics(), [router], settings, token=token)
