"""MLflow: one MLflow run for the whole corl run, every process logging into it.

MLflow runs take metrics from any number of clients, so the run's processes share one: the first to
report creates it (named after the run key, in the experiment ``tracking.project``, the cohort config
as its params) and claims its id in Redis; a process that created one too but lost the claim deletes
its own. Metrics are ``<member>/<source>/<stat>`` with MLflow's ``step`` = the record's axis (a
trainer's step, a round, a weight version), sent with ``log_batch`` from the tracker's thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .identity import SharedRun
from .records import Record
from .worker import Outcome

MAX_BATCH = 1000  # metrics per log_batch call (MLflow's limit)
MAX_PARAM_CHARS = 500


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """The cohort config as MLflow params: dotted keys, values as text (long ones cut)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = str(value)[:MAX_PARAM_CHARS]
    return out


class MlflowTracker:
    name = "mlflow"

    def __init__(
        self, uri: str, experiment: str, shared: SharedRun, config: Mapping[str, Any], ends_run: bool = False
    ) -> None:
        self.uri, self.experiment, self.shared = uri, experiment, shared
        self.config, self.ends_run = dict(config), ends_run
        self._client: Any = None
        self.run_id: str | None = None

    def open(self) -> None:
        # One unreachable call should cost seconds, not MLflow's default minutes of retries: this
        # tracker is retried with its own back-off. The environment still wins.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(self.uri)
        key, created = self.shared.key(), []

        def create() -> str:
            run = self._client.create_run(self._experiment_id(), run_name=key, tags={"corl.run_id": self.shared.run_id})
            created.append(run.info.run_id)
            return str(run.info.run_id)

        self.run_id = self.shared.claim(f"mlflow:{self.uri}", create)
        for run_id in created:
            if run_id != self.run_id:
                self._client.delete_run(run_id)  # another process claimed the run first
            else:
                self._log_params()

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self._client.get_experiment_by_name(self.experiment)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self._client.create_experiment(self.experiment))
        except MlflowException:  # created by another process meanwhile
            return str(self._client.get_experiment_by_name(self.experiment).experiment_id)

    def _log_params(self) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flat_params(self.config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per call
            self._client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, records: Sequence[Record]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(key, value, int(r.time * 1000), r.step) for r in records for key, value in r.items()]
        for i in range(0, len(metrics), MAX_BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + MAX_BATCH])

    def close(self, outcome: Outcome) -> None:
        if self.ends_run and self.run_id is not None:
            self._client.set_terminated(self.run_id, status=outcome.upper())  # FINISHED, FAILED, KILLED
