"""The live dashboard: the page and its vendored assets (``static/``), and the view it polls.

The page is plain HTML and JavaScript with uPlot 1.6.32 (MIT, ``static/uPlot.LICENSE``) served from
this package: no CDN, so it works offline and inside clusters. It polls
``GET /v1/runs/{run}/dashboard`` (``DashboardView``) every few seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from importlib.resources import files

from corl.config import CohortConfig
from corl.proto import DashboardView, MemberView, RunStats
from corl.services.errors import NotFoundError

# Vendored from the npm registry (`npm pack uplot@1.6.32`: dist/uPlot.iife.min.js, dist/uPlot.min.css,
# LICENSE); a test pins these digests, so an upgrade is a deliberate change of both.
UPLOT_SHA256 = {
    "uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    "uPlot.min.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
}

ASSETS: dict[str, str] = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}


def _static(name: str) -> bytes:
    return files("corl.services.aggregator").joinpath("static", name).read_bytes()


def page(run_id: str) -> str:
    """The dashboard page for ``run_id`` (the run it polls is written into the page)."""
    return _static("dashboard.html").decode().replace("{{RUN_ID_JSON}}", json.dumps(run_id))


def asset(name: str) -> tuple[bytes, str]:
    """A vendored asset and its media type; only the files listed in ``ASSETS`` are served."""
    if name not in ASSETS:
        raise NotFoundError(f"no dashboard asset {name!r}")
    return _static(name), ASSETS[name]


def build_view(
    cfg: CohortConfig,
    stats: RunStats,
    versions: Mapping[str, int | None],
    backlog: Mapping[str, int],
) -> DashboardView:
    latest = stats.rounds[-1].members if stats.rounds else {}
    members = []
    for m in cfg.members:
        last = latest.get(m.name)
        acc = stats.heldout.get(m.name)
        members.append(
            MemberView(
                name=m.name,
                role=m.role,
                weight_version=versions.get(m.name),
                mean_reward=last.mean_reward if last else None,
                label_rate=last.label_rate if last else None,
                distinct_answers=last.distinct_answers if last else None,
                pseudo_label_accuracy=last.pseudo_label_accuracy if last else None,
                heldout_accuracy=acc.accuracy if acc else None,
                heldout_version=acc.weight_version if acc else None,
                backlog=backlog.get(m.name) if m.role == "trained" else None,
                collapse=m.name in stats.collapse,
                label_share=last.label_share if last else None,
                weight_transfer=stats.weight_transfer.get(m.name),
                endpoint=stats.endpoints.get(m.name),
            )
        )
    return DashboardView(
        run_id=stats.run_id,
        next_round=stats.next_round,
        updated_at=time.time(),
        members=members,
        rounds=stats.rounds,
        grader_weights=stats.grader_weights,
        quarantined=stats.quarantined,
        collapse=stats.collapse,
    )
