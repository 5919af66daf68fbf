"""``corl serve aggregator``: run the aggregator (rounds, rewards, streams, grading pool)."""

from __future__ import annotations

from pathlib import Path

import typer


def aggregator(
    config: Path = typer.Option(..., "--config", help="Cohort config file (YAML)."),
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(8100, help="Port."),
    log_level: str | None = typer.Option(None, help="Log level (default CORL_LOG_LEVEL or INFO)."),
) -> None:
    """Drive rollout rounds for the run in CONFIG and serve /v1/prompts, /v1/graders, /v1/grading/*,
    /v1/runs/{run}/stats, the live /dashboard, the reward server for outside trainers (/get_reward:
    OpenRLHF, /v1/reward: slime) and /metrics.

    Other settings come from CORL_AGGREGATOR_* variables; the admin token from CORL_ADMIN_TOKEN.
    """
    import uvicorn

    from corl.services.aggregator import AggregatorSettings, create_app
    from corl.services.aggregator.server import RoundsHaltingServer

    from .config_file import service_config
    from .logs import setup_logging

    setup_logging(log_level)
    cfg = service_config(config)
    settings = AggregatorSettings(config=config)
    typer.echo(f"aggregator for run {cfg.run_id!r} ({len(cfg.members)} members) on http://{host}:{port}")
    typer.echo(f"dashboard: http://{host}:{port}/dashboard")
    app = create_app(settings, config=cfg)
    RoundsHaltingServer(uvicorn.Config(app, host=host, port=port, log_config=None)).run()
