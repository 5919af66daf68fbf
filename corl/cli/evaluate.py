"""``corl eval``: evaluate every member of a cohort on the task's held-out split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .logs import quiet_transformers
from .preflight import FORCE_HELP, MEMORY_HELP


def eval_cohort(
    cohort: Annotated[
        Path | None, typer.Option(help="Cohort directory (with cohort.json): evaluate in this process.")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Cohort config (YAML): start a model server per member and evaluate through /v1/generate "
            "on the config's task, data source and sampling settings.",
        ),
    ] = None,
    split: Annotated[
        str, typer.Option(help="With --config: 'eval' (the held-out split) or 'all' (every gradable problem).")
    ] = "eval",
    chunk: Annotated[int, typer.Option(min=1, help="With --config: problems per /v1/generate request.")] = 8,
    n_prompts: Annotated[
        int | None, typer.Option(help="Evaluate on the first N held-out prompts (default: all).")
    ] = None,
    samples: Annotated[
        int,
        typer.Option(
            help="Samples per prompt for majority@k (k=this; 1: greedy only), at temperature 1, or with "
            "--config at the config's sampling settings."
        ),
    ] = 8,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the results here.")] = None,
    threads: Annotated[int, typer.Option(help="torch threads.")] = 1,
    task_name: Annotated[
        str | None,
        typer.Option("--task", help="Task to evaluate on; default: the one the cohort warmed up on (its manifest)."),
    ] = None,
    split_seed: Annotated[
        int | None, typer.Option(help="Seed of the task's splits; default: the cohort's (its manifest), else 0.")
    ] = None,
    max_tokens: Annotated[int | None, typer.Option(help="New tokens per answer; default: the task's.")] = None,
    force: Annotated[bool, typer.Option("--force", help="With --config: " + FORCE_HELP)] = False,
    memory: Annotated[str | None, typer.Option("--memory", help="With --config: " + MEMORY_HELP)] = None,
) -> None:
    """Greedy, temperature-1 and majority@k accuracy, distinct answers and answer entropy per member.

    With --config the numbers come through the model servers (greedy pass@1, and maj@k over
    --samples samples at the config's temperature), with a progress bar."""
    if (cohort is None) == (config is None):
        raise typer.BadParameter("give exactly one of --cohort (in process) or --config (through the servers)")
    if config is not None:
        if split not in ("eval", "all"):
            raise typer.BadParameter(f"{split!r}: expected 'eval' or 'all'", param_hint="--split")
        from .evaluate_servers import eval_through_servers

        eval_through_servers(config, n_prompts=n_prompts, k=samples, split=split, chunk=chunk,
                             json_out=json_out, force=force, memory=memory)  # fmt: skip
        return
    assert cohort is not None
    import torch
    from rich.console import Console
    from rich.table import Table

    from corl.cohort.evaluate import evaluate_member
    from corl.cohort.manifest import read_manifest
    from corl.tasks import get_task

    torch.set_num_threads(threads)
    quiet_transformers()
    try:
        manifest = read_manifest(cohort)
    except FileNotFoundError as err:
        raise typer.BadParameter(str(err), param_hint="--cohort") from None
    name = task_name or manifest.task
    if name is None:
        raise typer.BadParameter(
            f"the '{manifest.preset}' cohort was not built on a task: name one with --task", param_hint="--task"
        )
    try:
        task = get_task(name)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--task") from None
    seed_of_splits = split_seed if split_seed is not None else (manifest.seed or 0)
    try:
        task.splits(seed_of_splits)
    except NotImplementedError as err:
        raise typer.BadParameter(
            f"task {name!r} has no held-out split of its own: {err}", param_hint="--task"
        ) from None
    console = Console()
    results: dict[str, dict[str, float]] = {}
    with console.status("") as status:
        for m in manifest.members:
            status.update(f"evaluating {m.name} ...")
            results[m.name] = evaluate_member(
                cohort / m.path,
                task,
                n_prompts,
                seed,
                split_seed=seed_of_splits,
                n_samples=samples,
                max_tokens=max_tokens,
            )

    k = samples
    table = Table(title=f"{name} held-out eval ({int(next(iter(results.values()))['n_prompts'])} prompts)")
    cols = [
        ("member", None),
        ("family", None),
        ("greedy acc", "greedy_acc"),
        ("sample acc (T=1)", "sample_acc"),
        (f"maj@{k} acc", f"maj@{k}_acc"),
        (f"distinct / {k}", "distinct"),
        ("entropy (nats)", "entropy"),
        ("valid", "valid_rate"),
    ]
    for title, _ in cols:
        table.add_column(title, justify="left" if title in ("member", "family") else "right")
    for m in manifest.members:
        r = results[m.name]
        table.add_row(
            m.name,
            m.family,
            *(f"{r[key]:.2f}" if key in ("distinct", "entropy") else f"{r[key]:.1%}" for _, key in cols[2:] if key),
        )
    console.print(table)
    if json_out:
        json_out.write_text(json.dumps({"cohort": str(cohort), "seed": seed, "members": results}, indent=2) + "\n")
        console.print(f"results: {json_out}")
