"""HTTP routes: thin, each one call into ``ModelServing``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.types import DecoratedCallable
from pydantic import BaseModel

from corl.proto import (
    GenerateRequest,
    GenerateResponse,
    GradeRequest,
    GradeResponse,
    HealthResponse,
    InfoResponse,
    ReadyResponse,
    WeightBroadcastRequest,
    WeightTransferRequest,
    WeightTransferResponse,
    WeightUpdateRequest,
    WeightUpdateResponse,
)
from corl.services.http import error_responses, require_admin, require_cohort
from corl.services.service_app import started

from .metrics import ServerMetrics
from .serving import ModelServing
from .transfer import WeightTransferServing


# Dependencies are ``async def``: FastAPI would run a plain ``def`` in a worker thread, a thread hop per request.
async def get_metrics(request: Request) -> ServerMetrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


async def get_serving(request: Request) -> ModelServing:
    return started(request, "the model server")


async def get_transfer(request: Request) -> WeightTransferServing:
    return started(request, "the model server", "transfer")


Serving = Annotated[ModelServing, Depends(get_serving)]
Transfer = Annotated[WeightTransferServing, Depends(get_transfer)]
Metrics = Annotated[ServerMetrics, Depends(get_metrics)]
Cohort = Depends(require_cohort)


router = APIRouter()


def _json(model: BaseModel) -> Response:
    """Serialise once with pydantic-core: the response model was already validated when built, and
    FastAPI's generic path (re-validate, encode, dump) costs as much as a tiny model's forward pass."""
    return Response(model.model_dump_json(), media_type="application/json")


def _cohort_post(path: str, answer: type[BaseModel], *errors: int) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """A POST route of the cohort's own calls: the cohort token required, ``answer`` documented as the
    response model (the route returns it through ``_json``), ``errors`` the statuses it may answer."""
    return router.post(path, response_model=answer, responses=error_responses(*errors), dependencies=[Cohort])


@_cohort_post("/v1/generate", GenerateResponse, 401, 413, 422, 503)
async def generate(body: GenerateRequest, serving: Serving) -> Response:
    return _json(await serving.generate(body))


@_cohort_post("/v1/grade", GradeResponse, 401, 403, 413, 422, 503)
async def grade(body: GradeRequest, serving: Serving) -> Response:
    return _json(await serving.grade(body))


def _admin_post(path: str, answer: type[BaseModel], *errors: int) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """A POST route of the weights' admin calls: the admin token required (401, 403 besides ``errors``)."""
    return router.post(
        path, response_model=answer, responses=error_responses(401, 403, *errors), dependencies=[Depends(require_admin)]
    )


@_admin_post("/v1/weights", WeightUpdateResponse, 409, 413, 422, 503)
async def update_weights(body: WeightUpdateRequest, serving: Serving) -> WeightUpdateResponse:
    return await serving.update_weights(body)


@_admin_post("/v1/weights/transfer", WeightTransferResponse, 404, 409, 413, 422, 503)
async def join_weight_group(body: WeightTransferRequest, transfer: Transfer) -> WeightTransferResponse:
    return await transfer.join(body)


@_admin_post("/v1/weights/broadcast", WeightUpdateResponse, 409, 413, 422, 503)
async def receive_weights(body: WeightBroadcastRequest, transfer: Transfer) -> WeightUpdateResponse:
    return await transfer.receive(body)


@router.get("/v1/info", response_model=InfoResponse, responses=error_responses(503))
async def info(serving: Serving) -> InfoResponse:
    serving.require_ready()
    return serving.info()


@router.get("/healthz", response_model=HealthResponse)
async def healthz() -> HealthResponse:
    return HealthResponse()


@router.get("/readyz", response_model=ReadyResponse, responses=error_responses(503))
async def readyz(serving: Serving) -> ReadyResponse:
    serving.require_ready()
    return ReadyResponse(weight_version=serving.backend.weight_version)


@router.get("/metrics", response_class=Response, include_in_schema=True)
async def metrics(m: Metrics) -> Response:
    return Response(m.render(), media_type=m.content_type)
