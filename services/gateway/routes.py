"""HTTP routes: thin, each one call into ``GatewayServing``. Every route but the probes and /metrics
takes the cohort token (``require_cohort``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from corl.proto.gateway import ForwardedHead, HarvestStats
from corl.proto.openai import ModelList
from corl.services.http import error_responses, operational_routes, require_cohort
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


def _headers(request: Request) -> dict[str, str]:
    return dict(request.headers)  # lower-case names


@openai.post("/v1/chat/completions", response_class=Response, responses=_REPLY, openapi_extra=_BODY)
async def chat_completions(request: Request, gateway: Gateway) -> Response:
    """Forward a chat completion to the member its model names; harvest its conversation."""
    return await gateway.forward("chat", await request.body(), _headers(request))


@openai.post("/v1/completions", response_class=Response, responses=_REPLY, openapi_extra=_BODY)
async def completions(request: Request, gateway: Gateway) -> Response:
    """Forward a text completion to the member its model names; harvest its prompt."""
    return await gateway.forward("completions", await request.body(), _headers(request))


@openai.get("/v1/models", response_model=ModelList, responses=error_responses(401, 503))
async def models(gateway: Gateway) -> ModelList:
    """The run's members: the names a request's model may take."""
    return gateway.models()


@openai.get("/v1/harvest/stats", response_model=HarvestStats, responses=error_responses(401, 503))
async def harvest_stats(gateway: Gateway) -> HarvestStats:
    """The run's harvest counters: harvested, redacted, dropped by reason, trained on, in the pool."""
    return await gateway.harvest_stats()


router.include_router(openai)
