"""``corl serve gateway``: the harvesting gateway an agent app points its OpenAI ``base_url`` at."""

from __future__ import annotations

from pathlib import Path

import typer


def gateway(
    config: Path = typer.Option(..., "--config", help="Cohort config file (YAML): members and the gateway section."),
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int | None = typer.Option(None, help="Port (default: the port of gateway.url, else 8400)."),
    log_level: str | None = typer.Option(None, help="Log level (default CORL_LOG_LEVEL or INFO)."),
) -> None:
    """Forward /v1/chat/completions, /v1/completions (streamed or not) unchanged to the member each
    request's model names, answer /v1/models and /v1/harvest/stats, and harvest the conversations into
    the run's prompt pool under gateway.harvest (sampled, bounded, de-duplicated, redacted first).

    Agents authenticate with the cohort token (CORL_COHORT_TOKEN); other settings come from
    CORL_GATEWAY_* variables; outside endpoints' keys from the variables their api_key_env names.
    """
    from urllib.parse import urlsplit

    import uvicorn

    from corl.services.gateway import GatewaySettings, create_app

    from .config_file import service_config
    from .logs import setup_logging

    setup_logging(log_level)
    cfg = service_config(config)
    port = port or (urlsplit(cfg.gateway.url).port if cfg.gateway.url else None) or 8400
    settings = GatewaySettings(config=config)
    harvest = cfg.gateway.harvest
    what = f"harvesting {harvest.sample:.0%} of {', '.join(harvest.routes)}" if harvest.enabled else "not harvesting"
    typer.echo(f"gateway for run {cfg.run_id!r} ({len(cfg.members)} members, {what}) on http://{host}:{port}/v1")
    # No access log: a line per forwarded request costs a proxy more than its routing (/metrics counts them).
    uvicorn.run(create_app(settings, config=cfg), host=host, port=port, log_config=None, access_log=False)
