"""``corl serve <service>``: run one service in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("model")
def model(
    model_dir: Annotated[Path, typer.Option("--model", help="Member directory (save_pretrained layout).")],
    name: Annotated[str | None, typer.Option(help="Member name (default: the directory's name).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default CORL_HOST or 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default CORL_PORT or 8000).")] = None,
    backend: Annotated[
        str | None, typer.Option(help="transformers | vllm (default CORL_BACKEND or transformers).")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="Log level (default CORL_LOG_LEVEL or INFO).")] = None,
    weights_root: Annotated[
        Path | None,
        typer.Option(help="Weights store: /v1/weights loads only directories under it (default CORL_WEIGHTS_ROOT)."),
    ] = None,
) -> None:
    """Serve one cohort member: /v1/generate, /v1/grade, /v1/weights, /v1/info, /metrics.

    Every other setting comes from the environment (CORL_ADMIN_TOKEN, CORL_MAX_N, ...); flags win.
    """
    import uvicorn

    from corl.services.model.app import create_app
    from corl.services.model.settings import ServerSettings

    from .logs import setup_logging

    setup_logging(log_level)
    if not model_dir.is_dir():
        raise typer.BadParameter(f"{model_dir} is not a directory", param_hint="--model")
    overrides = {
        "model_dir": str(model_dir.resolve()),
        "name": name,
        "host": host,
        "port": port,
        "backend": backend,
        "weights_root": weights_root,
    }
    settings = ServerSettings(**{k: v for k, v in overrides.items() if v is not None})
    typer.echo(f"serving {settings.member_name} ({settings.backend}) on http://{settings.host}:{settings.port}")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_config=None)
