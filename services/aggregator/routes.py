"""HTTP routes: thin, versioned; each one call into ``serving.AggregatorServing``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import HTMLResponse

from corl.proto import (
    DashboardView,
    GraderRegistered,
    GraderRegistration,
    GradingResults,
    GradingResultsAccepted,
    GradingTasks,
    OpenRLHFRewardRequest,
    OpenRLHFRewardResponse,
    PromptsAccepted,
    PromptsPost,
    RunStats,
    SlimeRewardRequest,
    SlimeRewardResponse,
)
from corl.services.errors import NotFoundError
from corl.services.http import (
    Credentials,
    bearer_token,
    check_token,
    error_responses,
    grader_bearer,
    operational_routes,
    require_admin,
    reward_bearer,
)
from corl.services.service_app import started

from . import dashboard
from .serving import AggregatorServing
from .settings import RewardServerSettings

router = APIRouter()


async def get_serving(request: Request) -> AggregatorServing:
    return started(request, "the aggregator")


Serving = Annotated[AggregatorServing, Depends(get_serving)]


async def current_grader(serving: Serving, credentials: Annotated[Credentials, Depends(grader_bearer)]) -> str:
    return await serving.authenticate_grader(bearer_token(credentials))


Grader = Annotated[str, Depends(current_grader)]
Admin = [Depends(require_admin)]


router.include_router(operational_routes(get_serving))


@router.get("/v1/runs/{run}/stats", responses=error_responses(404, 422, 503))
async def run_stats(serving: Serving, run: str, last: Annotated[int | None, Query(ge=1)] = None) -> RunStats:
    return await serving.stats(run, last)


@router.get("/v1/runs/{run}/dashboard", responses=error_responses(404, 422, 503))
async def run_dashboard(serving: Serving, run: str, last: Annotated[int | None, Query(ge=1)] = None) -> DashboardView:
    return await serving.dashboard(run, last)


@router.get("/dashboard", response_class=HTMLResponse)
async def dashboard_page(serving: Serving) -> HTMLResponse:
    return HTMLResponse(dashboard.page(serving.cfg.run_id))


@router.get("/dashboard/assets/{name}", include_in_schema=False)  # static files, not part of the contract
async def dashboard_asset(name: str) -> Response:
    body, media_type = dashboard.asset(name)
    return Response(body, media_type=media_type, headers={"Cache-Control": "max-age=3600"})


async def require_reward_routes(request: Request, credentials: Annotated[Credentials, Depends(reward_bearer)]) -> None:
    """The reward routes answer only when enabled, and with their own token when one is set."""
    rs: RewardServerSettings = request.app.state.reward_server
    if not rs.enabled:
        raise NotFoundError("the reward routes are off (CORL_AGGREGATOR_REWARD_SERVER__ENABLED=true serves them)")
    if rs.token is not None:
        check_token(bearer_token(credentials), rs.token.get_secret_value(), "reward")


Reward = [Depends(require_reward_routes)]


@router.post("/get_reward", dependencies=Reward, responses=error_responses(401, 404, 413, 422, 503))
async def get_reward(serving: Serving, body: OpenRLHFRewardRequest) -> OpenRLHFRewardResponse:
    """OpenRLHF's remote reward protocol (``--remote_rm_url http://AGGREGATOR/get_reward``)."""
    return await serving.openrlhf_reward(body)


@router.post("/v1/reward", dependencies=Reward, responses=error_responses(401, 404, 413, 422, 503))
async def reward(serving: Serving, body: SlimeRewardRequest) -> SlimeRewardResponse:
    """slime's ``remote_rm`` (``--rm-type remote_rm --rm-url http://AGGREGATOR/v1/reward --reward-key reward``)."""
    return await serving.slime_reward(body)


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
