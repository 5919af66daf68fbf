"""``corl secrets check``: refuse to deploy with placeholder or short secrets (compose's first service)."""

from __future__ import annotations

import os
import secrets as _secrets

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("check")
def check(names: list[str] = typer.Argument(..., help="Environment variables that hold secrets.")) -> None:
    """Exit 1, naming each one, when a secret is unset, a placeholder or shorter than 16 characters."""
    from corl.secrets_check import weak_secrets

    weak = weak_secrets(os.environ, names)
    for line in weak:
        typer.echo(f"refusing to start: {line}", err=True)
    if weak:
        typer.echo(f"set them in .env, e.g. {names[0]}={_secrets.token_urlsafe(32)}", err=True)
        raise typer.Exit(1)
    typer.echo(f"secrets ok: {', '.join(names)}")


@app.command("new")
def new() -> None:
    """Print a fresh random secret (32 bytes, URL-safe)."""
    typer.echo(_secrets.token_urlsafe(32))
