"""OpenAI-compatible routes: thin, each one call into ``OpenAIServing`` (shapes in ``corl.proto.openai``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from corl.proto.openai import (
    WEIGHT_VERSION_HEADER,
    ChatCompletion,
    ChatCompletionRequest,
    CompletionRequest,
    ModelList,
    TextCompletion,
)
from corl.services.http import error_responses, require_cohort
from corl.services.service_app import started

from .openai_serving import OpenAIServing, Served


async def get_openai(request: Request) -> OpenAIServing:
    return started(request, "the model server", "openai")


OpenAI = Annotated[OpenAIServing, Depends(get_openai)]

_ERRORS = error_responses(401, 404, 413, 422, 503)
# One server-sent event: `data:` holds a chunk's JSON (ChatCompletionChunk / TextCompletion), or an
# ErrorResponse when the stream fails after its first chunk; the last is `[DONE]`.
_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    "required": ["data"],
    "description": "data: <chunk JSON> ... data: [DONE]",
}
_STREAM = {"text/event-stream": {"itemSchema": _EVENT}}  # OpenAPI 3.2: the schema of each event
_HEADERS = {WEIGHT_VERSION_HEADER: {"description": "Weights behind every choice.", "schema": {"type": "integer"}}}

router = APIRouter(tags=["openai"], dependencies=[Depends(require_cohort)])


def _answer(served: Served) -> Response:
    headers = {WEIGHT_VERSION_HEADER: str(served.weight_version)}
    if served.events is not None:
        return StreamingResponse(
            served.events, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
        )
    assert served.body is not None
    return Response(served.body.model_dump_json(), media_type="application/json", headers=headers)


_SERVED = {200: {"content": _STREAM, "headers": _HEADERS}, **_ERRORS}


@router.post("/v1/chat/completions", response_model=ChatCompletion, responses=_SERVED)
async def chat_completions(body: ChatCompletionRequest, openai: OpenAI) -> Response:
    return _answer(await openai.chat(body))


@router.post("/v1/completions", response_model=TextCompletion, responses=_SERVED)
async def completions(body: CompletionRequest, openai: OpenAI) -> Response:
    return _answer(await openai.complete(body))


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401, 503))
async def models(openai: OpenAI) -> ModelList:
    return openai.models()
