"""``corl cohort``: build a cohort of small models of different families and show its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .logs import quiet_transformers

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(no_args_is_help=True)


@app.command("init")
def init(
    out: Annotated[Path, typer.Option(help="Cohort directory to create.")],
    preset: Annotated[
        str,
        typer.Option(
            help="Cohort preset: tiny (4 toy members built here), micro (2, for tests), smol "
            "(SmolLM2-135M-Instruct + Gemma-3-270M from PyPI packages, converted once), trio "
            "(smol + Qwen2.5-Coder-0.5B-Instruct: three families) or qwen-pair (Qwen2.5-Coder-0.5B and "
            "-1.5B-Instruct)."
        ),
    ] = "tiny",
    seed: Annotated[int, typer.Option(help="Task split seed; member i is initialised with seed + i.")] = 0,
    task: Annotated[str, typer.Option(help="Task the members warm up on.")] = "addition",
    member: Annotated[list[str] | None, typer.Option("--member", help="Build only these members (repeatable).")] = None,
    band: Annotated[
        tuple[float, float] | None,
        typer.Option(help="Greedy-accuracy band to stop warm-up in, e.g. --band 0.4 0.55."),
    ] = None,
    max_steps: Annotated[int | None, typer.Option(help="Warm-up step limit per member.")] = None,
    check_every: Annotated[int | None, typer.Option(help="Steps between accuracy checks.")] = None,
    jobs: Annotated[int, typer.Option(help="Members built at once, each in its own process.")] = 2,
    threads: Annotated[int, typer.Option(help="torch threads per member.")] = 1,
    dtype: Annotated[
        str, typer.Option(help="packaged presets: dtype of the converted weights (float32, bfloat16).")
    ] = "float32",
    from_hub: Annotated[
        list[str] | None,
        typer.Option(
            "--from-hub",
            metavar="ID",
            help="Instead of a preset: a Hugging Face Hub model, org/name[@revision][=member-name] (repeatable), "
            "pinned to the commit it resolves to and linked from OUT (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply).",
        ),
    ] = None,
) -> None:
    """Build, warm up and save every member (or fetch and convert a packaged preset's, or pin hub models);
    write cohort.json and print it as a table. A packaged preset reuses the members already converted in OUT."""
    from rich.console import Console

    from corl.cohort.packaged import PACKAGED_PRESETS

    if from_hub:
        build_hub_with_progress(out, Console(), from_hub)
        return

    if preset in PACKAGED_PRESETS:
        build_packaged_with_progress(out, Console(), preset=preset, members=member, dtype=dtype)
        return

    overrides = {
        k: v for k, v in {"band": band, "max_steps": max_steps, "check_every": check_every}.items() if v is not None
    }
    workers = {"jobs": jobs, "threads": threads}
    build_with_progress(
        out, Console(), preset=preset, seed=seed, task=task, members=member, overrides=overrides, **workers
    )


def ensure_cohort(cohort: Path, console: Console, preset: str = "tiny", jobs: int = 2) -> None:
    """Build ``preset`` into ``cohort`` unless a cohort (``cohort.json``) is already there."""
    from corl.cohort.packaged import PACKAGED_PRESETS

    if (cohort / "cohort.json").is_file():
        console.print(f"cohort: {cohort}")
        return
    if preset in PACKAGED_PRESETS:
        console.print(f"no cohort at {cohort}: fetching and converting the '{preset}' preset")
        build_packaged_with_progress(cohort, console, preset=preset)
        return
    console.print(f"no cohort at {cohort}: building the '{preset}' preset (a few minutes on 2 cores)")
    build_with_progress(cohort, console, preset=preset, jobs=jobs)


def build_with_progress(
    out: Path,
    console: Console,
    *,
    preset: str = "tiny",
    seed: int = 0,
    task: str = "addition",
    members: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    jobs: int = 2,
    threads: int = 1,
) -> None:
    """``corl.cohort.build.build_cohort`` with a progress bar per member (a plain line per event when the
    console is not a terminal) and the manifest table."""
    import logging

    import torch
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from corl.cohort.build import build_cohort
    from corl.cohort.manifest import manifest_table
    from corl.cohort.presets import get_preset

    torch.set_num_threads(threads)
    # transformers warns once per member about its reference Mamba kernels and padding; not actionable here.
    logging.getLogger("transformers").setLevel(logging.ERROR)
    quiet_transformers()
    try:
        p = get_preset(preset)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--preset") from None
    limit = int((overrides or {}).get("max_steps", p.warmup.max_steps))
    columns = (
        TextColumn("{task.description:<8}"),
        BarColumn(),
        TextColumn("step {task.completed:>4.0f}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    )
    live = console.is_terminal  # in logs (compose, CI) bars never draw: print a line per event instead
    with Progress(*columns, console=console, disable=not live) as progress:
        bars: dict[str, TaskID] = {}

        def report(name: str, event: str, step: int, value: float) -> None:
            if not live:
                lines = {
                    "start": f"{name}: warm-up started ({int(value):,} params)",
                    "check": f"{name}: step {step}, held-out accuracy {value:.1%}",
                    "done": f"{name}: done, kept step {step}, accuracy {value:.1%}",
                }
                if event in lines:
                    console.print(lines[event], highlight=False, soft_wrap=True)
                return
            if event == "start":
                bars[name] = progress.add_task(name, total=limit, status=f"{int(value):,} params")
            elif event == "step":
                progress.update(bars[name], completed=step)
            elif event == "check":
                progress.update(bars[name], completed=step, status=f"acc {value:.1%}")
            elif event == "done":
                progress.update(bars[name], completed=limit, status=f"kept step {step}, acc {value:.1%}")

        try:
            workers = {"jobs": jobs, "threads": threads}
            manifest = build_cohort(
                out,
                p,
                seed=seed,
                task_name=task,
                warmup_overrides=overrides,
                members=members,
                progress=report,
                **workers,
            )
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
    console.print(manifest_table(manifest))
    console.print(f"manifest: {out / 'cohort.json'}")
    missed = [m.name for m in manifest.members if manifest.band and not m.in_band]
    if missed:
        console.print(f"[yellow]warning: {', '.join(missed)} stopped outside the band (closest checkpoint kept)")


def build_packaged_with_progress(
    out: Path, console: Console, *, preset: str = "smol", members: list[str] | None = None, dtype: str = "float32"
) -> None:
    """``corl.cohort.packaged.build_packaged_cohort`` with one status line per step and the manifest table."""
    import logging

    from corl.cohort.manifest import manifest_table
    from corl.cohort.packaged import SourceError, build_packaged_cohort

    logging.getLogger("transformers").setLevel(logging.ERROR)
    quiet_transformers()
    steps = {
        "reuse": "already converted, reused",
        "fetch": "fetching",
        "convert": "converting (dequantize and save; minutes for a cold cache)",
        "done": "done",
    }
    with console.status("", spinner="dots") as status:

        def report(name: str, event: str, detail: str) -> None:
            line = f"{name}: {steps.get(event, event)} ({detail})"
            console.print(line, highlight=False, soft_wrap=True)
            status.update(line)

        try:
            manifest = build_packaged_cohort(out, preset, dtype=dtype, members=members, progress=report)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
        except SourceError as err:
            console.print(f"[red]error: {err}")
            raise typer.Exit(1) from None
    console.print(manifest_table(manifest))
    console.print(f"manifest: {out / 'cohort.json'}")


def build_hub_with_progress(out: Path, console: Console, specs: list[str]) -> None:
    """``corl.cohort.hub.build_hub_cohort`` with a line per step and the manifest table; a missing or
    gated model exits with status 2, naming it."""
    from corl.cohort.hub import build_hub_cohort
    from corl.cohort.manifest import manifest_table
    from corl.hub import HubError
    from corl.preflight import PreflightError

    steps = {"resolve": "resolving", "fetch": "fetching", "done": "pinned"}

    def report(name: str, event: str, detail: str) -> None:
        console.print(f"{name}: {steps.get(event, event)} {detail}", highlight=False, soft_wrap=True)

    try:
        manifest = build_hub_cohort(out, specs, progress=report)
    except (HubError, PreflightError) as err:
        console.print(f"[red]error: {err}[/red]", highlight=False)
        raise typer.Exit(2) from None
    console.print(manifest_table(manifest))
    console.print(f"manifest: {out / 'cohort.json'}", highlight=False)


@app.command("show")
def show(cohort: Annotated[Path, typer.Argument(help="Cohort directory.")]) -> None:
    """Print a cohort's manifest as a table."""
    from rich.console import Console

    from corl.cohort.manifest import manifest_table, read_manifest

    try:
        manifest = read_manifest(cohort)
    except FileNotFoundError as err:
        raise typer.BadParameter(str(err), param_hint="COHORT") from None
    Console().print(manifest_table(manifest))
