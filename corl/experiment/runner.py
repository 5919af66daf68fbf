"""Run every (mode, seed) through the embedded services and collect before/after evaluations."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from corl.cohort.evaluate import evaluate_member
from corl.embedded.config import cohort_members, embedded_config
from corl.embedded.run import RunOptions, run_embedded, start_redis
from corl.tasks import get_task

from .report import MemberResult, collapse_table, load_history, markdown_table, plot_curves, write_summary_csv

ALL_MODES = ("none", "ground_truth", "self_vote", "peer_label", "peer_agreement", "peer_pool")


@dataclass
class ExperimentOptions:
    modes: Sequence[str] = ALL_MODES
    seeds: Sequence[int] = (0,)
    rounds: int = 40
    eval_prompts: int = 200
    eval_every: int = 10


def _evaluate(model_dir: Path, seed: int, n_prompts: int) -> dict[str, float]:
    return evaluate_member(model_dir, get_task("addition"), n_prompts=n_prompts, seed=seed)


def run_experiment(cohort_dir: Path, out: Path, opts: ExperimentOptions, console: Console) -> list[MemberResult]:
    """``none`` is the starting cohort itself (no training: after == before); every other mode is a
    full embedded run with only ``reward.mode`` and the seeds changed."""
    out.mkdir(parents=True, exist_ok=True)
    members = cohort_members(cohort_dir)
    results: list[MemberResult] = []
    histories: dict[str, list[dict]] = {}
    t0 = time.monotonic()
    for seed in opts.seeds:
        with console.status(f"seed {seed}: evaluating the starting cohort"):
            before = {m: _evaluate(cohort_dir / m, seed, opts.eval_prompts) for m in members}
        for mode in opts.modes:
            if mode == "none":
                results += [MemberResult(mode, seed, m, before[m], before[m], 0) for m in members]
                continue
            run_dir = out / "runs" / f"{mode}-seed{seed}"
            done = run_dir / "result.json"
            if done.exists():  # finished by an earlier invocation: an interrupted experiment resumes
                console.print(f"{mode}, seed {seed}: done earlier ({done})")
                results += [MemberResult(**r) for r in json.loads(done.read_text())]
                if seed == opts.seeds[0]:
                    histories[mode] = load_history(run_dir / "metrics.jsonl")
                continue
            console.rule(f"{mode}, seed {seed} ({time.monotonic() - t0:.0f}s elapsed)")
            redis_server = start_redis(run_dir)
            try:
                cfg = embedded_config(
                    cohort_dir,
                    run_dir,
                    redis_server.url,
                    overrides={
                        "run_id": f"{mode.replace('_', '-')}-s{seed}",
                        "reward.mode": mode,
                        "training.seed": seed,
                        "rounds.max_rounds": opts.rounds,
                    },
                )
                run = run_embedded(cfg, run_dir, RunOptions(rounds=opts.rounds, eval_every=opts.eval_every), console)
            finally:
                redis_server.close()
            if seed == opts.seeds[0]:
                histories[mode] = load_history(run.history)
            finished = []
            for m in members:
                final = run_dir / "final" / m
                after = _evaluate(final if final.exists() else cohort_dir / m, seed, opts.eval_prompts)
                finished.append(MemberResult(mode, seed, m, before[m], after, run.final[m].weight_version or 0))
            done.write_text(json.dumps([dataclasses.asdict(r) for r in finished]))
            results += finished
            _write(results, histories, out, opts.modes)
    _write(results, histories, out, opts.modes)
    (out / "experiment.json").write_text(
        json.dumps(
            {
                "modes": list(opts.modes),
                "seeds": list(opts.seeds),
                "rounds": opts.rounds,
                "seconds": round(time.monotonic() - t0, 1),
            },
            indent=2,
        )
    )
    return results


def _write(results: list[MemberResult], histories: dict[str, list[dict]], out: Path, modes: Sequence[str]) -> None:
    if not results:
        return
    write_summary_csv(results, out / "summary.csv")
    collapse = f"\nSustained falls (seed {results[0].seed}):\n\n{collapse_table(histories)}" if histories else ""
    (out / "results.md").write_text(markdown_table(results, modes) + collapse)
    if histories:
        plot_curves(histories, out)
