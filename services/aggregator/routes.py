"""HTTP routes: thin, versioned; the work happens in ``service.AggregatorService``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
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

from .errors import Unavailable
from .service import AggregatorService

router = APIRouter()


def get_service(request: Request) -> AggregatorService:
    service: AggregatorService | None = getattr(request.app.state, "service", None)
    if service is None:
        raise Unavailable("the aggregator is starting")
    return service


Service = Annotated[AggregatorService, Depends(get_service)]
Authorization = Annotated[str | None, Header()]


async def current_grader(service: Service, authorization: Authorization = None) -> str:
    return await service.pool.authenticate(authorization)


GraderName = Annotated[str, Depends(current_grader)]


@router.get("/healthz")
async def healthz() -> HealthResponse:
    return HealthResponse()


@router.get("/readyz")
async def readyz(service: Service) -> HealthResponse:
    return HealthResponse()


@router.get("/metrics")
async def metrics(service: Service) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/runs/{run}/stats")
async def run_stats(service: Service, run: str, last: Annotated[int | None, Query(ge=1)] = None) -> RunStats:
    return await service.stats(run, last)


@router.post("/v1/prompts")
async def post_prompts(service: Service, body: PromptsPost, authorization: Authorization = None) -> PromptsAccepted:
    return await service.post_prompts(authorization, body)


@router.post("/v1/graders", status_code=201)
async def register_grader(
    service: Service, body: GraderRegistration, authorization: Authorization = None
) -> GraderRegistered:
    return await service.register_grader(authorization, body)


@router.get("/v1/grading/tasks")
async def grading_tasks(
    service: Service,
    grader: GraderName,
    max_tasks: Annotated[int, Query(alias="max", ge=1)] = 16,
    wait: Annotated[float, Query(ge=0)] = 0.0,
) -> GradingTasks:
    return GradingTasks(tasks=await service.pool.lease(grader, max_tasks, wait))


@router.post("/v1/grading/results")
async def grading_results(service: Service, grader: GraderName, body: GradingResults) -> GradingResultsAccepted:
    return await service.pool.submit(grader, body)
