"""Building a process's ``Tracking`` from the cohort config's ``tracking`` section."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from corl.config import CohortConfig

from .identity import SharedRun
from .metrics import TrackingMetrics
from .mlflow_tracker import MlflowTracker
from .tensorboard_tracker import TensorBoardTracker
from .wandb_tracker import WandbTracker
from .worker import Tracker, TrackerWorker, Tracking


def build_tracking(
    cfg: CohortConfig,
    process: str,
    registry: CollectorRegistry | None = None,
    *,
    redis_url: str | None = None,
    ends_run: bool = False,
) -> Tracking:
    """The trackers ``cfg.tracking.report_to`` names, for the process called ``process`` (``trainer-<member>``,
    ``aggregator``, ``supervisor``), counting on ``registry``. ``ends_run``: this process owns the run's
    lifetime (``corl run``'s supervisor) and marks it finished where the tool has such a state.
    Raises ``TrackerUnavailable`` (a ``ValueError``) when a tracker cannot be used from here."""
    tc = cfg.tracking
    if not tc.report_to:
        return Tracking()
    tc.check_usable()
    shared = SharedRun(redis_url or cfg.redis_url, cfg.run_id, tc.run_name)
    config = cfg.model_dump(mode="json")
    trackers: dict[str, Tracker] = {
        "tensorboard": TensorBoardTracker(tc.directory(), shared, process),
        "wandb": WandbTracker(tc.wandb, tc.project, tc.directory(), shared, process, config),
        "mlflow": MlflowTracker(tc.mlflow.uri() or "", tc.project, shared, config, ends_run=ends_run),
    }
    metrics = TrackingMetrics(registry, tc.report_to)
    workers = [TrackerWorker(trackers[name], metrics, tc.queue_size) for name in tc.report_to]
    return Tracking(workers, tc.close_timeout_s)
