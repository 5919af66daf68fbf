"""``corl train``: one member's trainer process (Redis in, weights out)."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from .logs import setup_logging


def train(
    config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="Cohort config (YAML)."),
    member: str = typer.Option(..., "--member", help="Name of the trained member."),
    max_steps: int | None = typer.Option(None, "--max-steps", min=1, help="Stop when the global step reaches N."),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=0, max=65535, help="Prometheus endpoint (overrides CORL_TRAINER_METRICS_PORT)."
    ),
    idle_exit: float | None = typer.Option(
        None, "--idle-exit", min=0.0, help="Exit after the stream has been empty this many seconds."
    ),
) -> None:
    """Train one member on its graded batches; checkpoint, publish weights; SIGTERM stops cleanly.

    Process settings come from the environment (prefix CORL_TRAINER_: CONSUMER, METRICS_PORT, DEVICE,
    THREADS, BLOCK_MS, ...); the servers' admin token from CORL_ADMIN_TOKEN.
    """
    setup_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per weight push is logged by the trainer
    from rich.console import Console

    from corl.config import ConfigError, load_config
    from corl.trainer.group import run_follower
    from corl.trainer.loop import Trainer
    from corl.trainer.settings import TrainerSettings

    console = Console(stderr=True)
    try:
        cfg = load_config(config)
        cfg.member(member)
    except (ConfigError, KeyError) as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(2) from None
    settings = TrainerSettings()
    if metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": metrics_port})
    try:
        sharding = _group(cfg, member, settings)
        if sharding is not None and not sharding.leader:
            steps = run_follower(cfg, member, settings, sharding)
            console.print(f"{member}: rank {sharding.rank} followed {steps} steps")
            return
        trainer = Trainer(cfg, member, settings, sharding=sharding)
    except ValueError as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(2) from None
    trainer.install_signal_handlers()
    try:
        trainer.setup()
        state = trainer.run(max_steps=max_steps, idle_exit_s=idle_exit)
    finally:
        trainer.close()
    console.print(f"{member}: step {state.step}, weight version {state.weight_version}")


def _group(cfg, member: str, settings):  # type: ignore[no-untyped-def]
    """This process's place in the member's trainer group when torchrun started it, else None."""
    from corl.trainer.group import check_group_size
    from corl.trainer.sharding import Sharding, launched_world_size

    world = launched_world_size()
    if world == 1 and cfg.member(member).trainer_processes == 1:
        return None
    check_group_size(cfg, member, world)
    return Sharding(cfg.training.distributed, timeout_s=settings.group_timeout_s)
