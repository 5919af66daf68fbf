"""``corl run``: the whole loop on this machine (embedded default)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import typer

from .logs import setup_logging
from .plan import GPUS_HELP, node_plan, show_plan
from .preflight import FORCE_HELP, MEMORY_HELP, pin_hub_models, read_hub_data, run_preflight

DEFAULT_ROUNDS = 40


def run(
    config: Path | None = typer.Option(None, "--config", help="Cohort config (YAML); default: the tiny cohort."),
    rounds: int | None = typer.Option(
        None,
        "--rounds",
        min=1,
        help=f"Rounds of the whole run (default {DEFAULT_ROUNDS}; with --resume, the run's own), "
        "those done before a resume included.",
    ),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: runs/run-<time>)."),
    cohort: Path | None = typer.Option(
        None, "--cohort", help="Cohort directory (built if missing; default cohort/tiny)."
    ),
    reward: str | None = typer.Option(None, "--reward", help="Override reward.mode."),
    eval_every: int = typer.Option(10, "--eval-every", min=1, help="Held-out eval every N weight versions."),
    restart: str = typer.Option(
        "no",
        "--restart",
        help="When a child dies: 'no' (stop the run) or 'on-failure[:N]' (restart it, at most N times, "
        "with exponential back-off; N defaults to 5).",
    ),
    resume: Path | None = typer.Option(
        None,
        "--resume",
        metavar="RUN_DIR",
        help="Continue the stopped or crashed run in RUN_DIR: its rounds, checkpoints, weights and history "
        "go on (its own config unless --config or --cohort is given; a change that breaks the run is refused).",
    ),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    memory: str | None = typer.Option(None, "--memory", help=MEMORY_HELP),
    gpus: int | None = typer.Option(None, "--gpus", min=0, help=GPUS_HELP),
) -> None:
    """Start a real Redis, a model server per member, the aggregator and a trainer per trained member."""
    from rich.console import Console

    from corl.config import TrackerUnavailable
    from corl.embedded.config import DEFAULT_COHORT_DIR, PLANNED_REDIS_URL, embedded_config
    from corl.embedded.processes import ChildDied, RestartPolicy, exit_on_sigterm
    from corl.embedded.resume import ResumeRefused, check_resumable, stored_config
    from corl.embedded.run import RunOptions, run_embedded, start_redis

    from .cohort import ensure_cohort
    from .config_file import read_config

    try:
        policy = RestartPolicy.parse(restart)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--restart") from None
    if resume is not None and out is not None:
        raise typer.BadParameter("--resume names the run directory already; drop --out", param_hint="--out")
    setup_logging("WARNING")
    exit_on_sigterm()
    console = Console()
    run_dir = (resume or out or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")).resolve()

    def refuse(message: str) -> typer.Exit:
        console.print(message, style="red", markup=False, highlight=False)
        return typer.Exit(2)

    try:
        stored = stored_config(run_dir)
    except ResumeRefused as err:
        raise refuse(str(err)) from None
    if resume is not None and stored is None:
        raise refuse(f"{run_dir} holds no run to resume (no cohort.yaml: it never started)")
    if resume is None and stored is not None:
        raise refuse(f"{run_dir} already holds run {stored.run_id}: continue it with --resume {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)
    base = read_config(config, console) if config else None
    if base is not None:  # hub ids resolved once, pinned in the run directory (a resume finds the same commits)
        base = pin_hub_models(base, run_dir, console)
    if base is None and stored is not None and cohort is None:
        base = stored  # resuming with the run's own config
    cohort = cohort or DEFAULT_COHORT_DIR
    if base is None:
        ensure_cohort(cohort, console)
    total = rounds or (stored.rounds.max_rounds if stored else None) or DEFAULT_ROUNDS
    overrides: dict = {"rounds.max_rounds": total}
    if reward:
        overrides["reward.mode"] = reward
    # Before anything starts: every member's model exists and the run fits (no Redis is contacted).
    planned = embedded_config(cohort, run_dir, PLANNED_REDIS_URL, base=base, overrides=overrides)
    if stored is not None:
        try:
            check_resumable(run_dir, stored, planned)
        except ResumeRefused as err:
            raise refuse(str(err)) from None
    try:
        planned.tracking.check_usable()  # a tracker's library or server address missing: say so before starting
    except TrackerUnavailable as err:
        raise refuse(str(err)) from None
    run_preflight(planned, run_dir, console, force=force, memory=memory)
    read_hub_data(planned, console)
    # Which devices each server and trainer gets, shown when there are GPUs to place; refused when it does not fit.
    placement = node_plan(planned, gpus, console)
    if not show_plan(placement, console, always=False):
        raise typer.Exit(2)
    (run_dir / "placement.json").write_text(json.dumps(asdict(placement), indent=2) + "\n")
    redis_server = start_redis(run_dir)
    try:
        cfg = embedded_config(cohort, run_dir, redis_server.url, base=base, overrides=overrides)
        console.print(
            f"run {cfg.run_id}: {len(cfg.members)} members, reward {cfg.reward.mode}, {total} rounds -> {run_dir}"
        )
        opts = RunOptions(
            rounds=total, eval_every=eval_every, restart=policy, resume=stored is not None, placement=placement
        )
        result = run_embedded(cfg, run_dir, opts, console)
    except ChildDied:
        raise typer.Exit(1) from None
    finally:
        redis_server.close()
    console.print(f"done: {result.rounds} rounds; metrics {result.history}; final weights {run_dir / 'final'}")
