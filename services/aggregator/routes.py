"""HTTP routes: thin, versioned; each one call into ``serving.AggregatorServing``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import HTMLResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from corl.proto import (
    DashboardView,
    ErrorResponse,
    GraderRegistered,
    GraderRegistration,
    GradingResults,
    GradingResultsAccepted,
    GradingTasks,
    HealthResponse,
    OpenRLHFRewardRequest,
    OpenRLHFRewardResponse,
    PromptsAccepted,
    PromptsPost,
    RunStats,
    SlimeRewardRequest,
    SlimeRewardResponse,
)
from corl.services.errors import UnavailableError
from corl.services.http import Authorization, require_admin

from . import dashboard
from .serving import AggregatorServing

router = APIRouter()


async def get_serving(request: Request) -> AggregatorServing:
    serving: AggregatorServing | None = getattr(request.app.state, "serving", None)
    if serving is None:
        raise UnavailableError("the aggregator is starting")
    return serving


Serving = Annotated[AggregatorServing, Depends(get_serving)]


async def current_grader(serving: Serving, authorization: Authorization = None) -> str:
    return await serving.authenticate_grader(authorization)


Grader = Annotated[str, Depends(current_grader)]
Admin = [Depends(require_admin)]


@router.get("/healthz")
async def healthz() -> HealthResponse:
    return HealthResponse()


@router.get("/readyz")
async def readyz(serving: Serving) -> HealthResponse:
    return HealthResponse()


@router.get("/metrics")
async def metrics(serving: Serving) -> Response:
    return Response(generate_latest(serving.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/runs/{run}/stats")
async def run_stats(serving: Serving, run: str, last: Annotated[int | None, Query(ge=1)] = None) -> RunStats:
    return await serving.stats(run, last)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI: these statuses answer with the one error shape."""
    return {code: {"model": ErrorResponse} for code in codes}


@router.get("/v1/runs/{run}/dashboard", responses=_errors(404, 422, 503))
async def run_dashboard(serving: Serving, run: str, last: Annotated[int | None, Query(ge=1)] = None) -> DashboardView:
    return await serving.dashboard(run, last)


@router.get("/dashboard", response_class=HTMLResponse)
async def dashboard_page(serving: Serving) -> HTMLResponse:
    return HTMLResponse(dashboard.page(serving.cfg.run_id))


@router.get("/dashboard/assets/{name}", include_in_schema=False)  # static files, not part of the contract
async def dashboard_asset(name: str) -> Response:
    body, media_type = dashboard.asset(name)
    return Response(body, media_type=media_type, headers={"Cache-Control": "max-age=3600"})


@router.post("/get_reward", responses=_errors(413, 422, 503))
async def get_reward(serving: Serving, body: OpenRLHFRewardRequest) -> OpenRLHFRewardResponse:
    """OpenRLHF's remote reward protocol (``--remote_rm_url http://AGGREGATOR/get_reward``)."""
    return await serving.openrlhf_reward(body)


@router.post("/v1/reward", responses=_errors(413, 422, 503))
async def reward(serving: Serving, body: SlimeRewardRequest) -> SlimeRewardResponse:
    """slime's ``remote_rm`` (``--rm-type remote_rm --rm-url http://AGGREGATOR/v1/reward --reward-key reward``)."""
    return await serving.slime_reward(body)


@router.post("/v1/prompts", dependencies=Admin)
async def post_prompts(serving: Serving, body: PromptsPost) -> PromptsAccepted:
    return await serving.post_prompts(body)


@router.post("/v1/graders", status_code=201, dependencies=Admin)
async def register_grader(serving: Serving, body: GraderRegistration) -> GraderRegistered:
    return await serving.register_grader(body)


@router.get("/v1/grading/tasks")
async def grading_tasks(
    serving: Serving,
    grader: Grader,
    max_tasks: Annotated[int, Query(alias="max", ge=1)] = 16,
    wait: Annotated[float, Query(ge=0)] = 0.0,
) -> GradingTasks:
    return await serving.grading_tasks(grader, max_tasks, wait)


@router.post("/v1/grading/results")
async def grading_results(serving: Serving, grader: Grader, body: GradingResults) -> GradingResultsAccepted:
    return await serving.grading_results(grader, body)
