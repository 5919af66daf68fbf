"""``corl serve evaluator``: held-out accuracy of a run's members through their servers, every few versions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def evaluator(
    config: Path = typer.Option(..., "--config", help="Cohort config file (YAML)."),
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(8200, help="Port."),
    eval_every: int | None = typer.Option(
        None, "--eval-every", min=1, help="Read a member again every N weight versions (default 10)."
    ),
    eval_prompts: int | None = typer.Option(
        None, "--eval-prompts", min=1, help="Held-out problems per reading (default 200)."
    ),
    log_level: str | None = typer.Option(None, help="Log level (default CORL_LOG_LEVEL or INFO)."),
) -> None:
    """Read every served member's held-out accuracy through its first server, at start and every
    --eval-every weight versions, into the run's Redis (the aggregator's /v1/runs/{run}/stats and
    dashboard show it), /metrics (corl_evaluator_*) and the config's experiment trackers; serve the latest
    readings at /v1/runs/{run}/heldout.

    Other settings come from CORL_EVALUATOR_* variables (settings.py); flags win.
    """
    import uvicorn

    from corl.services.evaluator import EvaluatorSettings, create_app

    from .config_file import service_config
    from .logs import setup_logging

    setup_logging(log_level)
    cfg = service_config(config)
    overrides: dict[str, Any] = {"eval_every": eval_every, "eval_prompts": eval_prompts}
    settings = EvaluatorSettings(config=config, **{k: v for k, v in overrides.items() if v is not None})
    members = ", ".join(m.name for m in cfg.served_members())
    typer.echo(
        f"evaluator for run {cfg.run_id!r} ({members}): {settings.eval_prompts} held-out problems "
        f"every {settings.eval_every} versions, on http://{host}:{port}"
    )
    uvicorn.run(create_app(settings, config=cfg), host=host, port=port, log_config=None)
