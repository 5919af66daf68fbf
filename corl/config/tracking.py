"""The cohort config's ``tracking`` section: which experiment trackers every process reports to.

Every process of a run (trainers, the aggregator, ``corl run``'s supervisor) reads the same
section, so one run shows as one run in each tool (``corl.tracking`` says how). The libraries are
an optional extra (``pip install 'corl[tracking]'``): a config naming a tracker loads anywhere, and
the process that would report to it refuses to start when the library is missing. Keys never live
here: W&B reads ``WANDB_API_KEY``, MLflow its ``MLFLOW_TRACKING_*`` variables, from the environment.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from .base import _Section

TrackerName = Literal["tensorboard", "wandb", "mlflow"]

# The module each tracker imports (its own client library).
TRACKER_MODULES: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


class TrackerUnavailable(ValueError):
    """A tracker the config names that this process cannot use: its library is not installed, or its
    server or key is not given."""


class WandbConfig(_Section):
    mode: Literal["online", "offline"] = Field(
        default="online",
        description="online: stream to the W&B server (key from WANDB_API_KEY); offline: write run files under "
        "tracking.dir, uploaded later with `wandb sync`.",
    )
    entity: str | None = Field(default=None, description="W&B entity (user or team); None: the key's default.")


class MlflowConfig(_Section):
    tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking server, e.g. http://mlflow:5000 (any MLflow tracking URI); None: the "
        "MLFLOW_TRACKING_URI variable, which must then be set.",
    )

    def uri(self) -> str | None:
        return self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None


class TrackingConfig(_Section):
    report_to: list[TrackerName] = Field(
        default_factory=list, description="Experiment trackers every process reports to (none by default)."
    )
    project: str = Field(
        default="corl", min_length=1, description="W&B project and MLflow experiment the run is filed under."
    )
    run_name: str | None = Field(
        default=None, description="Name of the run in every tracker (a start time is appended); None: run_id."
    )
    dir: str | None = Field(
        default=None,
        description="Folder for TensorBoard event files and W&B run files (relative to this file); None: "
        "`<run dir>/tracking` under `corl run`, else `tracking` in the working directory.",
    )
    wandb: WandbConfig = Field(default=WandbConfig(), description="W&B settings (wandb in report_to).")
    mlflow: MlflowConfig = Field(default=MlflowConfig(), description="MLflow settings (mlflow in report_to).")
    queue_size: int = Field(
        default=10_000,
        ge=1,
        description="Records held for a tracker while it is slow or down; past it they are dropped (and counted).",
    )
    close_timeout_s: float = Field(
        default=10.0, gt=0, description="How long a stopping process waits for each tracker to flush."
    )

    @field_validator("report_to")
    @classmethod
    def _once_each(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"a tracker is named twice: {v}")
        return v

    def directory(self) -> Path:
        return Path(self.dir or "tracking")

    def check_usable(self) -> None:
        """Raise ``TrackerUnavailable`` when a tracker cannot be used from this process: its library is not
        installed (the message names the extra), or MLflow has no tracking URI. Called where a process
        starts, not when the config is read: any tool may read a config that names trackers."""
        missing = [name for name in self.report_to if importlib.util.find_spec(TRACKER_MODULES[name]) is None]
        if missing:
            raise TrackerUnavailable(
                f"tracking.report_to names {missing}, not installed here: pip install 'corl[tracking]'"
            )
        if "wandb" in self.report_to and self.wandb.mode == "online" and not os.environ.get("WANDB_API_KEY"):
            # Without a key W&B would ask for one on the terminal, from a tracking thread.
            raise TrackerUnavailable("tracking.wandb.mode online needs WANDB_API_KEY (or tracking.wandb.mode: offline)")
        if "mlflow" in self.report_to and self.mlflow.uri() is None:
            raise TrackerUnavailable(
                "tracking.report_to names mlflow but no server: set tracking.mlflow.tracking_uri or MLFLOW_TRACKING_URI"
            )
