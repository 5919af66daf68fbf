"""``corl experiment``: compare reward modes on the same starting cohort."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from .logs import setup_logging
from .preflight import FORCE_HELP, MEMORY_HELP, pin_hub_models, run_preflight


def experiment(
    modes: str = typer.Option(
        "none,ground_truth,self_vote,peer_label,peer_agreement,peer_pool",
        "--modes",
        help="Comma-separated reward modes; MODE:N runs that mode on the first N seeds only (self_vote:1).",
    ),
    seeds: str = typer.Option("0", "--seeds", help="Comma-separated seeds, e.g. 0,1,2."),
    out: Path = typer.Option(Path("runs/experiment"), "--out", help="Output directory."),
    cohort: Path = typer.Option(Path("cohort/tiny"), "--cohort", help="Starting cohort (built if missing)."),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="Start every run from this cohort config (its members, task, sampling) instead of --cohort; "
        "accuracy is then the servers' greedy held-out accuracy at the start and end of each run.",
    ),
    rounds: int = typer.Option(40, "--rounds", min=1, help="Rounds (training steps) per run."),
    eval_prompts: int = typer.Option(200, "--eval-prompts", min=10, help="Held-out problems each reading uses."),
    eval_every: int = typer.Option(10, "--eval-every", min=1, help="Held-out reading every N weight versions."),
    settings: list[str] = typer.Option(
        [],
        "--set",
        help="Config override for every run, KEY=YAML-VALUE (repeatable): --set reward.threshold=0.5; "
        "teachers=start gives each trained member its starting weights as a teacher (a frozen extra voter).",
    ),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    memory: str | None = typer.Option(None, "--memory", help=MEMORY_HELP),
) -> None:
    """Writes summary.csv, results.md and accuracy/diversity PNGs into OUT."""
    from rich.console import Console

    from corl.embedded.config import PLANNED_REDIS_URL, embedded_config
    from corl.embedded.processes import exit_on_sigterm
    from corl.embedded.resume import ResumeRefused
    from corl.experiment.runner import ExperimentOptions, run_experiment

    from .cohort import ensure_cohort
    from .config_file import read_config

    setup_logging("WARNING")
    exit_on_sigterm()
    console = Console()
    base = read_config(config, console) if config else None
    if base is None:
        ensure_cohort(cohort, console)
    else:  # every run of the experiment trains the same pinned snapshots
        out.mkdir(parents=True, exist_ok=True)
        base = pin_hub_models(base, out, console)
    overrides = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE, e.g. reward.threshold=0.5", param_hint="--set")
        overrides[key.strip()] = yaml.safe_load(value)
    # Before any run: every member's model exists and one run fits (no Redis is contacted).
    planned = embedded_config(cohort, out.resolve(), PLANNED_REDIS_URL, base=base, overrides=overrides)
    run_preflight(planned, out, console, force=force, memory=memory)
    names, limits = parse_modes(modes)
    opts = ExperimentOptions(
        modes=names,
        seed_limits=limits,
        seeds=[int(s) for s in seeds.split(",") if s.strip()],
        rounds=rounds,
        eval_prompts=eval_prompts,
        eval_every=eval_every,
        overrides=overrides,
        base=base,
    )
    try:
        run_experiment(cohort, out.resolve(), opts, console)
    except KeyboardInterrupt:
        console.print(
            f"[yellow]experiment interrupted: run it again to go on (finished runs in {out}/runs are kept, "
            "the unfinished one resumes where it stopped)[/yellow]"
        )
        raise typer.Exit(130) from None
    except ResumeRefused as err:
        console.print(str(err), style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None
    console.print((out / "results.md").read_text())
    console.print(f"written: {out}/summary.csv, results.md, accuracy.png, diversity.png")


def experiment_table(
    dirs: list[Path] = typer.Argument(..., help="Experiment output directories (the first holds ground_truth)."),
    out: Path = typer.Option(..., "--out", help="Where the combined summary.csv, results.md and plots go."),
) -> None:
    """Combine experiments (each with its own --set overrides) into one table: a variant of a mode is
    its own row, labelled by its overrides, and compared with the same ground-truth runs."""
    from corl.experiment.combine import combine
    from corl.experiment.report import write_report

    missing = [str(d) for d in dirs if not (d / "summary.csv").exists() or not (d / "experiment.json").exists()]
    if missing:
        raise typer.BadParameter(f"not experiment directories (no summary.csv / experiment.json): {missing}")
    results, histories, labels = combine(dirs)
    out.mkdir(parents=True, exist_ok=True)
    write_report(results, histories, out, labels)
    typer.echo((out / "results.md").read_text())


def experiment_answers(
    run: Path = typer.Argument(..., help="A finished run's directory (its final/<member> weights)."),
    config: Path = typer.Option(..., "--config", help="The config the run started from (members, task)."),
    n: int = typer.Option(12, "--n", min=1, help="Held-out problems to show per member."),
    out: Path | None = typer.Option(None, "--out", help="Also write the table to this markdown file."),
) -> None:
    """Print each member's greedy answers to the first N held-out problems before and after the run,
    what the task's reader took from each and whether it is right (read the answers behind a figure)."""
    from rich.console import Console

    from corl.experiment.answers import answers_table

    from .config_file import read_config

    if not (run / "final").is_dir():
        raise typer.BadParameter(f"{run} has no final/ weights: not a finished run", param_hint="RUN")
    table = answers_table(read_config(config, Console()), run, n)
    typer.echo(table)
    if out is not None:
        out.write_text(table)


def experiment_guard(
    runs: list[Path] = typer.Argument(..., help="Finished run directories (each with rounds.jsonl, result.json)."),
    samples: int = typer.Option(8, "--samples", min=1, help="The runs' samples per prompt (distinct-answer rate)."),
    settings: list[str] = typer.Option(
        [],
        "--set",
        help="A collapse-guard bound, KEY=VALUE (repeatable): --set echo_rise=0.3 --set distinct_fraction=0.5.",
    ),
    out: Path | None = typer.Option(None, "--out", help="Also write the table to this markdown file."),
) -> None:
    """Replay the collapse guard on finished runs: the round it trips at for each member (or would
    have, for a run made with action: alarm), beside the member's held-out accuracy before and after."""
    from corl.config import GuardConfig
    from corl.experiment.guard_replay import bounds_of, guard_table

    fields = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in GuardConfig.model_fields:
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE, KEY one of {sorted(GuardConfig.model_fields)}")
        fields[key.strip()] = yaml.safe_load(value)
    table = guard_table(runs, bounds_of(GuardConfig(**fields)), samples)
    typer.echo(table)
    if out is not None:
        out.write_text(table)


def parse_modes(spec: str) -> tuple[list[str], dict[str, int]]:
    """``"ground_truth,peer_pool,self_vote:1"`` -> the modes in order and their seed limits."""
    names: list[str] = []
    limits: dict[str, int] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, count = item.partition(":")
        if sep and not (count.isdigit() and int(count) >= 1):
            raise typer.BadParameter(f"{item!r}: expected MODE or MODE:N with N >= 1 seeds", param_hint="--modes")
        names.append(name)
        if sep:
            limits[name] = int(count)
    return names, limits
