"""HTTP routes: thin, versioned; each one call into ``serving.EvaluatorServing``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from corl.proto import HeldoutReadings
from corl.services.http import error_responses, operational_routes, require_cohort
from corl.services.service_app import started

from .serving import EvaluatorServing

router = APIRouter()


async def get_serving(request: Request) -> EvaluatorServing:
    return started(request, "the evaluator")


Serving = Annotated[EvaluatorServing, Depends(get_serving)]
router.include_router(operational_routes(get_serving))


@router.get("/v1/runs/{run}/heldout", responses=error_responses(401, 404, 503), dependencies=[Depends(require_cohort)])
async def heldout(serving: Serving, run: str) -> HeldoutReadings:
    """The latest held-out reading of each member this evaluator has (the aggregator's stats carry them too)."""
    return serving.view(run)
