"""Reading the cohort config a command was given: errors are printed, not raised as tracebacks."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from corl.config import CohortConfig, ConfigError, TrackerUnavailable, load_config


def service_config(path: Path) -> CohortConfig:
    """The cohort config a service (``corl serve aggregator|evaluator``) starts from, its trackers checked
    usable (library installed, server or key set); a bad one is an error of ``--config``."""
    try:
        cfg = load_config(path)
        cfg.tracking.check_usable()
    except (ConfigError, TrackerUnavailable) as err:
        raise typer.BadParameter(str(err), param_hint="--config") from None
    return cfg


def read_config(path: Path, console: Console) -> CohortConfig:
    """The cohort config at ``path``; a bad or missing config is printed and exits with status 2."""
    try:
        return load_config(path)
    except ConfigError as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(2) from None
