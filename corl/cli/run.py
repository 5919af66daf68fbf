"""``corl run``: the whole loop on this machine (embedded default)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from .logs import setup_logging
from .preflight import FORCE_HELP, MEMORY_HELP, run_preflight


def run(
    config: Path | None = typer.Option(None, "--config", help="Cohort config (YAML); default: the tiny cohort."),
    rounds: int = typer.Option(40, "--rounds", min=1, help="Rounds to produce and train on."),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: runs/run-<time>)."),
    cohort: Path = typer.Option(Path("cohort/tiny"), "--cohort", help="Cohort directory (built if missing)."),
    reward: str | None = typer.Option(None, "--reward", help="Override reward.mode."),
    eval_every: int = typer.Option(10, "--eval-every", min=1, help="Held-out eval every N weight versions."),
    restart: str = typer.Option(
        "no",
        "--restart",
        help="When a child dies: 'no' (stop the run) or 'on-failure[:N]' (restart it, at most N times, "
        "with exponential back-off; N defaults to 5).",
    ),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    memory: str | None = typer.Option(None, "--memory", help=MEMORY_HELP),
) -> None:
    """Start a real Redis, a model server per member, the aggregator and a trainer per trained member."""
    from rich.console import Console

    from corl.embedded.config import embedded_config
    from corl.embedded.processes import ChildDied, RestartPolicy, exit_on_sigterm
    from corl.embedded.run import RunOptions, run_embedded, start_redis

    from .cohort import ensure_cohort
    from .config_file import read_config

    try:
        policy = RestartPolicy.parse(restart)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--restart") from None
    setup_logging("WARNING")
    exit_on_sigterm()
    console = Console()
    run_dir = (out or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    base = read_config(config, console) if config else None
    if base is None:
        ensure_cohort(cohort, console)
    overrides: dict = {"rounds.max_rounds": rounds}
    if reward:
        overrides["reward.mode"] = reward
    # Before anything starts: every member's model exists and the run fits (no Redis is contacted).
    planned = embedded_config(cohort, run_dir, "redis://127.0.0.1:1/0", base=base, overrides=overrides)
    run_preflight(planned, run_dir, console, force=force, memory=memory)
    redis_server = start_redis(run_dir)
    try:
        cfg = embedded_config(cohort, run_dir, redis_server.url, base=base, overrides=overrides)
        console.print(
            f"run {cfg.run_id}: {len(cfg.members)} members, reward {cfg.reward.mode}, {rounds} rounds -> {run_dir}"
        )
        result = run_embedded(cfg, run_dir, RunOptions(rounds=rounds, eval_every=eval_every, restart=policy), console)
    except ChildDied:
        raise typer.Exit(1) from None
    finally:
        redis_server.close()
    console.print(f"done: {result.rounds} rounds; metrics {result.history}; final weights {run_dir / 'final'}")
