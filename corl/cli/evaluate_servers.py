"""``corl eval --config``: per member, greedy pass@1 and maj@k through freshly started model servers."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .logs import setup_logging
from .preflight import pin_hub_models, run_preflight


def eval_through_servers(
    config: Path,
    *,
    n_prompts: int | None,
    k: int,
    split: str,
    chunk: int,
    json_out: Path | None,
    force: bool = False,
    memory: str | None = None,
) -> None:
    from corl.config import MemberConfig
    from corl.data import load_splits
    from corl.embedded.config import PLANNED_REDIS_URL, embedded_config
    from corl.embedded.evaluate import ServerEval, evaluate_server
    from corl.embedded.processes import ChildDied, ProcessGroup, exit_on_sigterm
    from corl.embedded.start import start_model_servers
    from corl.services.http import bearer_headers
    from corl.tasks import get_task

    from .config_file import read_config

    setup_logging("WARNING")
    exit_on_sigterm()
    console = Console()
    base = read_config(config, console)
    task = get_task(base.task.name)
    splits = load_splits(base.task, base.rounds.prompt_source.seed)
    problems = splits.eval if split == "eval" else [*splits.eval, *splits.rl]
    examples = [e for e in problems if e.answer is not None or e.meta][:n_prompts]
    source = base.task.source or f"{task.name} generator"
    if not examples:
        raise typer.BadParameter(f"the {split!r} split of {source} has no gradable problems")
    measured = f"greedy pass@1 and maj@{k}" if k > 1 else "greedy pass@1"
    console.print(f"{task.name} on {source}: {len(examples)} problems ({split}), {measured}")
    with tempfile.TemporaryDirectory(prefix="corl-eval-") as tmp:
        run_dir = Path(tmp)
        # Servers only: no Redis is contacted, the URL just fills the config.
        cfg = embedded_config(run_dir, run_dir, PLANNED_REDIS_URL, base=pin_hub_models(base, run_dir, console))
        run_preflight(cfg, run_dir, console, force=force, memory=memory, trainers=False)
        token = os.environ.get("CORL_COHORT_TOKEN") or secrets.token_urlsafe(24)  # its servers, its client only
        group = ProcessGroup(
            run_dir / "logs",
            env={
                "CORL_LOG_LEVEL": "WARNING",
                "CORL_COHORT_TOKEN": token,
                "CORL_TASKS": cfg.task.name,
                **cfg.sandbox.env(),
            },
        )
        served = cfg.served_members()
        outside = [m.name for m in cfg.members if m.endpoint is not None]
        if outside:
            console.print(f"not evaluated (outside endpoints, not served by corl): {', '.join(outside)}")
        try:
            with console.status(f"starting {len(served)} model servers..."):
                start_model_servers(cfg, group, trainers=False)  # only the servers compute here
            per_member = len(examples) * (2 if k > 1 else 1)
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            timeout = httpx.Timeout(max(600.0, base.rounds.request_timeout_s), connect=5.0)
            with (
                Progress(*columns, console=console) as progress,
                httpx.Client(timeout=timeout, headers=bearer_headers(token)) as http,
            ):
                bars = {m.name: progress.add_task(m.name, total=per_member) for m in served}

                done = dict.fromkeys(bars, 0)

                def run(m: MemberConfig) -> ServerEval:
                    def advance(n: int) -> None:
                        progress.advance(bars[m.name], n)
                        done[m.name] += n
                        if not console.is_terminal:  # a log file gets a line per request, not a live bar
                            console.print(f"{m.name}: {done[m.name]}/{per_member}")

                    return evaluate_server(
                        http, m.servers[0], task, examples, cfg.sampling(), k=k, chunk=chunk, advance=advance
                    )

                # Every member at once: each server has its own process (and its share of the cores).
                with ThreadPoolExecutor(len(served)) as pool:
                    evals = dict(zip([m.name for m in served], pool.map(run, served), strict=True))
        except ChildDied as err:
            console.print(f"[red]{err.name} died (exit code {err.returncode}):[/red]")
            console.print(err.log_tail, markup=False, highlight=False)
            raise typer.Exit(1) from None
        finally:
            group.stop()
    results = {name: r.row() for name, r in evals.items()}
    kappas = error_overlap({name: r.greedy_correct for name, r in evals.items()})
    table = Table(title=f"{task.name} on {source} ({len(examples)} problems, {split} split)")
    cols = ["member", "pass@1 (greedy)", "parsed", "formatted"]
    if k > 1:
        cols += [f"sample acc (T={cfg.rounds.temperature:g})", f"maj@{k}", f"distinct / {k}"]
    for col in cols:
        table.add_column(col, justify="left" if col == "member" else "right")
    for name, r in results.items():
        cells = [f"{r['pass@1']:.1%}", f"{r['parsed']:.1%}", f"{r['formatted']:.1%}"]
        if k > 1:
            cells += [f"{r['sample_acc']:.1%}", f"{r[f'maj@{k}']:.1%}", f"{r['distinct']:.2f}"]
        table.add_row(name, *cells)
    console.print(table)
    if kappas:
        pairs = ", ".join(f"{pair} {'-' if v is None else f'{v:.2f}'}" for pair, v in kappas.items())
        console.print(f"error overlap (Cohen's kappa of greedy correctness): {pairs}")
    if json_out:
        doc = {"config": str(config), "source": source, "split": split, "k": k, "members": results, "kappa": kappas}
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"results: {json_out}")


def error_overlap(correct: dict[str, list[bool]]) -> dict[str, float | None]:
    """Cohen's kappa of every pair of members' per-problem correctness, keyed ``"a/b"``."""
    from itertools import combinations

    from corl.cohort.metrics import cohen_kappa

    return {f"{a}/{b}": cohen_kappa(correct[a], correct[b]) for a, b in combinations(correct, 2)}
