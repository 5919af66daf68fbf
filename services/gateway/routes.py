"""HTTP routes: thin, each one call into ``GatewayServing``. Every route but the probes and /metrics
takes the cohort token (``require_cohort``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from corl.proto.gateway import ForwardedHead, HarvestRoute, HarvestStats
from corl.proto.openai import ModelList
from corl.services.http import cohort_bearer, error_responses, operational_routes, require_cohort
from corl.services.service_app import started

from .serving import GatewayServing


async def get_serving(request: Request) -> GatewayServing:
    return started(request, "the gateway")


Gateway = Annotated[GatewayServing, Depends(get_serving)]

router = APIRouter()
router.include_router(operational_routes(get_serving))
openai = APIRouter(tags=["openai"], dependencies=[Depends(require_cohort)])

# The body is the agent's own OpenAI request, forwarded unread but for its model and stream fields.
_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ForwardedHead.model_json_schema() | {"additionalProperties": True}}},
    }
}
_REPLY = {
    200: {
        "description": "The member's reply, unchanged (JSON, or server-sent events when the request streams).",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **error_responses(401, 404, 413, 422, 429, 503),
}


class ForwardRoute(APIRoute):
    """A forwarding route, served without FastAPI's request handling (dependency solving, body parsing,
    response models), which a proxy pays on every agent call: the gateway's CPU per request fell from 2.8
    to 2.4 ms without it (``bench/gateway.py`` on the 2-core development machine). The endpoint gets the
    request after the same token check; its errors reach the app's handlers as any route's do; the
    OpenAPI entry (the security scheme of the router's dependency included) is the route's."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in (self.methods or ()):
            await super().handle(scope, receive, send)  # 405, as any route answers it
            return
        request = Request(scope, receive)
        await require_cohort(request, await cohort_bearer(request))
        response = await self.endpoint(request)
        await response(scope, receive, send)


async def _forward(request: Request, route: HarvestRoute) -> Response:
    gateway: GatewayServing = started(request, "the gateway")
    return await gateway.forward(route, await request.body(), dict(request.headers))  # lower-case names


# The dependency is what OpenAPI shows; ForwardRoute.handle makes the same check itself.
forward = APIRouter(tags=["openai"], dependencies=[Depends(require_cohort)], route_class=ForwardRoute)


@forward.post("/v1/chat/completions", response_class=Response, responses=_REPLY, openapi_extra=_BODY)
async def chat_completions(request: Request) -> Response:
    """Forward a chat completion to the member its model names; harvest its conversation."""
    return await _forward(request, "chat")


@forward.post("/v1/completions", response_class=Response, responses=_REPLY, openapi_extra=_BODY)
async def completions(request: Request) -> Response:
    """Forward a text completion to the member its model names; harvest its prompt."""
    return await _forward(request, "completions")


@openai.get("/v1/models", response_model=ModelList, responses=error_responses(401, 503))
async def models(gateway: Gateway) -> ModelList:
    """The run's members: the names a request's model may take."""
    return gateway.models()


@openai.get("/v1/harvest/stats", response_model=HarvestStats, responses=error_responses(401, 503))
async def harvest_stats(gateway: Gateway) -> HarvestStats:
    """The run's harvest counters: harvested, redacted, dropped by reason, trained on, in the pool."""
    return await gateway.harvest_stats()


router.include_router(forward)
router.include_router(openai)
