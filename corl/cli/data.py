"""``corl data``: what a cohort config's task source yields (counts, provenance, sample problems)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def show_data(
    config: Annotated[Path, typer.Option(help="Cohort config (YAML) whose task section to read.")],
    show: Annotated[int, typer.Option(help="Print this many held-out problems.")] = 3,
) -> None:
    """Load the task's problems exactly as a run would and print the split sizes and a few problems."""
    import logging

    from rich.console import Console
    from rich.table import Table

    from corl.config import ConfigError, load_config
    from corl.data import load_splits
    from corl.hub import HubError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = load_config(config)
    except ConfigError as err:
        raise typer.BadParameter(str(err), param_hint="--config") from None
    try:
        splits = load_splits(cfg.task, cfg.rounds.prompt_source.seed)
    except HubError as err:  # a hub data set that is missing, gated or not cached offline
        raise typer.BadParameter(str(err), param_hint="--config") from None
    console = Console()
    console.print(
        f"task [bold]{cfg.task.name}[/] from {cfg.task.source or 'its own generator'}: "
        f"{len(splits.rl)} RL prompts, {len(splits.eval)} held out"
    )
    table = Table("held-out problem", "answer (diagnostics only)")
    for ex in splits.eval[:show]:
        answer = ex.answer if ex.answer is not None else ("hidden tests" if ex.meta.get("test") else "-")
        table.add_row(ex.prompt.strip()[:200], answer)
    console.print(table)
