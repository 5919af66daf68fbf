"""``corl eval``: evaluate every member of a cohort on the task's held-out split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def eval_cohort(
    cohort: Annotated[Path, typer.Option(help="Cohort directory (with cohort.json).")],
    n_prompts: Annotated[
        int | None, typer.Option(help="Evaluate on the first N held-out prompts (default: all).")
    ] = None,
    samples: Annotated[int, typer.Option(help="Samples per prompt at temperature 1 (majority@k uses k=this).")] = 8,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the results here.")] = None,
    threads: Annotated[int, typer.Option(help="torch threads.")] = 1,
) -> None:
    """Greedy, temperature-1 and majority@k accuracy, distinct answers and answer entropy per member."""
    import torch
    from rich.console import Console
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from corl.cohort.evaluate import evaluate_member
    from corl.cohort.manifest import read_manifest
    from corl.tasks import get_task

    torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        manifest = read_manifest(cohort)
    except FileNotFoundError as err:
        raise typer.BadParameter(str(err), param_hint="--cohort") from None
    task = get_task(manifest.task)
    console = Console()
    results: dict[str, dict[str, float]] = {}
    with console.status("") as status:
        for m in manifest.members:
            status.update(f"evaluating {m.name} ...")
            results[m.name] = evaluate_member(
                cohort / m.path, task, n_prompts, seed, split_seed=manifest.seed, n_samples=samples
            )

    k = samples
    table = Table(title=f"{manifest.task} held-out eval ({int(next(iter(results.values()))['n_prompts'])} prompts)")
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
