"""Reading the cohort config a command was given: errors are printed, not raised as tracebacks."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from corl.config import CohortConfig, ConfigError, load_config


def read_config(path: Path, console: Console) -> CohortConfig:
    """The cohort config at ``path``; a bad or missing config is printed and exits with status 2."""
    try:
        return load_config(path)
    except ConfigError as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(2) from None
