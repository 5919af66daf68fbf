"""HTTP routes: thin, versioned; each one call into ``serving.AggregatorServing``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from corl.proto import (
    GraderRegistered,
    GraderRegistration,
    GradingResults,
    GradingResultsAccepted,
    GradingTasks,
    HealthResponse,
    PromptsAccepted,
    PromptsPost,
    RunStats,
)
from corl.services.errors import UnavailableError
from corl.services.http import Credentials, bearer_token, error_responses, grader_bearer, require_admin

from .serving import AggregatorServing

router = APIRouter()


async def get_serving(request: Request) -> AggregatorServing:
    serving: AggregatorServing | None = getattr(request.app.state, "serving", None)
    if serving is None:
        raise UnavailableError("the aggregator is starting")
    return serving


Serving = Annotated[AggregatorServing, Depends(get_serving)]


async def current_grader(serving: Serving, credentials: Annotated[Credentials, Depends(grader_bearer)]) -> str:
    return await serving.authenticate_grader(bearer_token(credentials))


Grader = Annotated[str, Depends(current_grader)]
Admin = [Depends(require_admin)]


@router.get("/healthz")
async def healthz() -> HealthResponse:
    return HealthResponse()


@router.get("/readyz", responses=error_responses(503))
async def readyz(serving: Serving) -> HealthResponse:
    return HealthResponse()


@router.get("/metrics", response_class=Response, responses=error_responses(503))
async def metrics(serving: Serving) -> Response:
    return Response(generate_latest(serving.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/runs/{run}/stats", responses=error_responses(404, 422, 503))
async def run_stats(serving: Serving, run: str, last: Annotated[int | None, Query(ge=1)] = None) -> RunStats:
    return await serving.stats(run, last)


@router.post("/v1/prompts", dependencies=Admin, responses=error_responses(401, 409, 413, 422, 503))
async def post_prompts(serving: Serving, body: PromptsPost) -> PromptsAccepted:
    return await serving.post_prompts(body)


@router.post("/v1/graders", status_code=201, dependencies=Admin, responses=error_responses(401, 409, 413, 422, 503))
async def register_grader(serving: Serving, body: GraderRegistration) -> GraderRegistered:
    return await serving.register_grader(body)


@router.get("/v1/grading/tasks", responses=error_responses(401, 422, 429, 503))
async def grading_tasks(
    serving: Serving,
    grader: Grader,
    max_tasks: Annotated[int, Query(alias="max", ge=1)] = 16,
    wait: Annotated[float, Query(ge=0)] = 0.0,
) -> GradingTasks:
    return await serving.grading_tasks(grader, max_tasks, wait)


@router.post("/v1/grading/results", responses=error_responses(401, 403, 413, 422, 429, 503))
async def grading_results(serving: Serving, grader: Grader, body: GradingResults) -> GradingResultsAccepted:
    return await serving.grading_results(grader, body)
