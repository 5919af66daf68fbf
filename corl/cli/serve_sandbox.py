"""``corl serve sandbox``: the one place untrusted programs run, for services whose host refuses the jail."""

from __future__ import annotations

import typer


def sandbox(
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(8300, help="Port."),
    max_concurrent: int | None = typer.Option(
        None, "--max-concurrent", min=1, help="Programs at once (default: CPUs)."
    ),
    log_level: str | None = typer.Option(None, help="Log level (default CORL_LOG_LEVEL or INFO)."),
) -> None:
    """Run programs sent to POST /v1/run in this host's bubblewrap jail; refuse to start where the jail
    cannot be built (unless CORL_SANDBOX_ALLOW_INSECURE=1). Model servers and the aggregator send their
    programs here when CORL_SANDBOX_URL names it; its token is CORL_SANDBOX_TOKEN.

    Other settings come from CORL_SANDBOX_* variables (settings.py); flags win.
    """
    import uvicorn

    from corl.services.sandbox import SandboxSettings, create_app

    from .logs import setup_logging

    setup_logging(log_level)
    settings = SandboxSettings(**({"max_concurrent": max_concurrent} if max_concurrent else {}))
    typer.echo(f"sandbox: {settings.max_concurrent} programs at once, on http://{host}:{port}")
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None)
