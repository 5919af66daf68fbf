"""The preflight as the commands show it: a table of what each process needs, and a refusal."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from corl.config import CohortConfig

FORCE_HELP = "Start even when the preflight estimates that the run does not fit this machine."
MEMORY_HELP = "Memory the run may use, e.g. 16GB (default: what the machine has available now)."


def parse_size(text: str | None) -> int | None:
    """``"4GB"``, ``"512MiB"``, ``"2g"`` or a number of bytes; ``None`` passes through."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if m is None:
        raise typer.BadParameter(f"{text!r}: expected a size such as 16GB, 512MB or a number of bytes")
    return int(float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2) or "_"))


def run_preflight(
    cfg: CohortConfig,
    run_dir: Path,
    console: Console,
    *,
    force: bool,
    memory: str | None = None,
    trainers: bool = True,
) -> None:
    """Refuse (exit status 2) when a member's model is missing, or when the run does not fit and
    ``force`` is off; a run that fits prints nothing."""
    from corl.preflight import PreflightError, check, table_rows

    try:
        report = check(cfg, run_dir, trainers=trainers, memory_available=parse_size(memory))
    except PreflightError as err:
        console.print(f"[red]preflight: {err}[/red]")
        raise typer.Exit(2) from None
    if report.fits:
        return
    table = Table(title="preflight: estimated memory and disk of this run")
    for col in ("process", "estimate", "largest items"):
        table.add_column(col)
    for row in table_rows(report):
        table.add_row(*row)
    console.print(table)
    if not force:
        console.print(
            "[red]preflight: this run does not fit this machine[/red] (fewer samples per round, smaller "
            "micro-batches, LoRA or gradient checkpointing make it smaller; --force starts it anyway)"
        )
        raise typer.Exit(2)
    console.print("[yellow]preflight: the run may not fit; starting it anyway (--force)[/yellow]")


def pin_hub_models(cfg: CohortConfig, run_dir: Path, console: Console) -> CohortConfig:
    """``cfg`` with its hub-id members resolved to pinned snapshots (``corl.hub.pin_models``; one line per
    model); a missing or gated model exits with status 2, naming it, before anything starts."""
    from corl.hub import HubError, pin_models

    try:
        pinned, pins = pin_models(cfg, run_dir)
    except HubError as err:
        console.print(f"[red]preflight: {err}[/red]", highlight=False)
        raise typer.Exit(2) from None
    for model in pins.values():
        console.print(f"hub: {model.id} -> {model.commit[:12]} ({model.path})", highlight=False, soft_wrap=True)
    return pinned


def read_hub_data(cfg: CohortConfig, console: Console) -> None:
    """A hub data set (``task.source: hf:...``) is read once here, before anything starts: a missing one
    exits with status 2, naming it, and the services then read it from the cache."""
    from corl.data.sources import parse_source

    if cfg.task.source is None or parse_source(cfg.task.source)[0] != "hf":
        return
    from corl.data.hub import read_hub
    from corl.hub import HubError

    try:
        _, provenance = read_hub(cfg.task.source.removeprefix("hf:"))
    except HubError as err:
        console.print(f"[red]preflight: {err}[/red]", highlight=False)
        raise typer.Exit(2) from None
    console.print("data: " + ", ".join(f"{k}={v}" for k, v in provenance.items()), highlight=False, soft_wrap=True)
