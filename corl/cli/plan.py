"""``corl plan``: the device plan of a run on one node, as a table; what ``corl run`` follows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from corl.config import CohortConfig
    from corl.placement import Plan

GPUS_HELP = "GPUs of this node the run may use (default: every GPU CUDA_VISIBLE_DEVICES or nvidia-smi lists)."


def plan_table(p: Plan) -> Table:
    """One row per process: its devices (CUDA_VISIBLE_DEVICES), what was asked, its shape and who shares its GPUs."""
    used = len(p.used)
    title = f"device plan: {used} of {len(p.devices)} GPU(s)" if p.devices else "device plan: no GPUs on this node"
    table = Table(title=title, caption="devices: each process's CUDA_VISIBLE_DEVICES; asked: the config's gpus")
    for col in ("process", "devices", "asked", "shape", "vLLM memory", "shares GPUs with"):
        table.add_column(col)
    for s in p.slots:
        if s.devices:
            where = ",".join(s.devices)
        elif s.asked:
            where = "[red]none left[/red]"
        else:
            where = "cpu" + (" (no GPU left)" if p.devices and s.asked is None else "")
        asked = "-" if s.asked is None else ("cpu" if s.asked == 0 else str(s.asked))
        if s.role == "trainer":
            shape = f"{s.processes} ranks" if s.processes > 1 else "1 rank"
        else:
            shape = s.backend + (f" TP{s.tensor_parallel}" if s.tensor_parallel > 1 else "")
        memory = "-" if s.memory_share is None else f"{s.memory_share:.2f}"
        table.add_row(s.process, where, asked, shape, memory, ", ".join(s.shared_with) or "-")
    return table


def show_plan(p: Plan, console: Console, *, always: bool = True) -> bool:
    """Print the plan (``always=False``: only when it places GPUs or does not fit), then its problems and
    what to change; True when it fits."""
    if always or p.places_gpus or not p.fits:
        console.print(plan_table(p))
    if p.fits:
        return True
    for problem in p.problems:
        console.print(f"[red]plan: {problem}[/red]", highlight=False)
    console.print("to make it fit:", highlight=False)
    for hint in p.hints:
        console.print(f"  - {hint}", markup=False, highlight=False)
    return False


def node_plan(cfg: CohortConfig, gpus: int | None, console: Console, *, node: bool = True) -> Plan:
    """The plan of ``cfg`` on this node (``node``) or on a node of ``gpus`` GPUs; a ``--gpus`` beyond
    this node's exits with status 2."""
    from corl.placement import NodeError, node_devices, plan

    if not node:
        return plan(cfg, [str(i) for i in range(gpus or 0)])
    try:
        devices = node_devices(gpus)
    except NodeError as err:
        console.print(f"[red]plan: {err}[/red]", highlight=False)
        raise typer.Exit(2) from None
    return plan(cfg, devices)


def plan_command(
    config: Path = typer.Option(..., "--config", help="Cohort config (YAML) to plan."),
    gpus: int | None = typer.Option(
        None, "--gpus", min=0, help="Plan for a node of this many GPUs (default: this node's, as corl run sees it)."
    ),
    compose: Path | None = typer.Option(
        None,
        "--compose",
        help="Also write a compose override file placing docker-compose.yml's gpu profile by this plan "
        "(docker compose -f docker-compose.yml -f FILE --profile gpu up).",
    ),
) -> None:
    """Print which GPUs each server and trainer of the run gets (CUDA_VISIBLE_DEVICES, vLLM tensor-parallel size,
    trainer ranks, vLLM memory share); exit 2, saying what to change, when the run does not fit."""
    from .config_file import read_config

    console = Console()
    cfg = read_config(config, console)
    p = node_plan(cfg, gpus, console, node=gpus is None)
    if compose is not None:
        from corl.placement.compose import gpu_profile_plan

        p = gpu_profile_plan(cfg, list(p.devices))
    if not show_plan(p, console):
        raise typer.Exit(2)
    if compose is not None:
        from corl.placement.compose import compose_override, dump_override

        header = f"The gpu profile placed by `corl plan --config {config} --gpus {len(p.devices)} --compose {compose}`."
        compose.write_text(dump_override(compose_override(p), header))
        console.print(f"compose override: {compose}", highlight=False)
