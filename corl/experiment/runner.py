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
from corl.config import CohortConfig
from corl.config.reward import RewardConfig
from corl.embedded.config import PLANNED_REDIS_URL, cohort_members, embedded_config, set_path
from corl.embedded.resume import check_resumable, stored_config
from corl.embedded.run import RunOptions, run_embedded, start_redis
from corl.proto import HeldoutAccuracy
from corl.tasks import get_task

from .combine import reward_settings
from .report import MemberResult, load_history, write_report

ALL_MODES = ("none", "ground_truth", "self_vote", "peer_label", "peer_agreement", "peer_pool")


@dataclass
class ExperimentOptions:
    modes: Sequence[str] = ALL_MODES
    seeds: Sequence[int] = (0,)
    rounds: int = 40
    eval_prompts: int = 200
    eval_every: int = 10
    overrides: dict = dataclasses.field(default_factory=dict)  # dotted config keys set in every run
    # mode -> how many of ``seeds`` (the first ones) it runs; unlisted modes run every seed. A baseline
    # whose outcome is known (self_vote collapses) need not cost as many runs as the modes compared.
    seed_limits: dict[str, int] = dataclasses.field(default_factory=dict)
    # A user's config (its members, task and sampling): every run starts from it, and accuracy is read
    # through the servers (greedy, held-out split) at the start and at the end of each run.
    base: CohortConfig | None = None


def served_readings(history: Sequence[dict], member: str, window: int = 5) -> tuple[dict, dict]:
    """(before, after) of one member from a run's snapshots: the held-out greedy accuracy its server
    gave at weight version 0 and at the end, and the mean distinct answers per prompt over the first
    and the last ``window`` snapshots that had them."""
    rows = [r["members"][member] for r in history if member in r["members"]]
    read = [m for m in rows if m.get("accuracy") is not None]
    distinct = [m["distinct_answers"] for m in rows if m.get("distinct_answers") is not None]
    if not read or read[0]["accuracy_version"] != 0:
        raise ValueError(f"{member}: no held-out reading at weight version 0 in the run's history")

    def mean(vals: Sequence[float]) -> float:
        return sum(vals) / len(vals) if vals else float("nan")

    def reading(m: dict) -> dict[str, float]:  # parsed / formatted: where the run's reader took them
        return {"greedy_acc": m["accuracy"], **{k: m[k] for k in ("parsed", "formatted") if m.get(k) is not None}}

    return (
        {**reading(read[0]), "distinct": mean(distinct[:window])},
        {**reading(read[-1]), "distinct": mean(distinct[-window:])},
    )


def start_readings(results: Sequence[MemberResult]) -> dict[str, HeldoutAccuracy]:
    """The start readings a finished run recorded, to give the next run of the same cohort."""
    return {
        r.member: HeldoutAccuracy(
            accuracy=r.before["greedy_acc"],
            weight_version=0,
            parsed=r.before.get("parsed"),
            formatted=r.before.get("formatted"),
            at=0.0,
        )
        for r in results
    }


def _evaluate(model_dir: Path, seed: int, n_prompts: int) -> dict[str, float]:
    return evaluate_member(model_dir, get_task("addition"), n_prompts=n_prompts, seed=seed)


def run_experiment(cohort_dir: Path, out: Path, opts: ExperimentOptions, console: Console) -> list[MemberResult]:
    """``none`` is the starting cohort itself (no training: after == before); every other mode is a
    full embedded run with only ``reward.mode`` and the seeds changed."""
    out.mkdir(parents=True, exist_ok=True)
    # Outside endpoint members vote in every run but have no held-out readings: results are corl's members.
    members = [m.name for m in opts.base.served_members()] if opts.base else cohort_members(cohort_dir)
    results: list[MemberResult] = []
    histories: dict[str, list[dict]] = {}
    t0 = time.monotonic()
    # The servers' start readings: the same cohort, problems and greedy decoding in every run.
    start_accuracy: dict[str, HeldoutAccuracy] | None = None
    for seed_index, seed in enumerate(opts.seeds):
        before: dict[str, dict[str, float]] = {}
        if opts.base is None:
            with console.status(f"seed {seed}: evaluating the starting cohort"):
                before = {m: _evaluate(cohort_dir / m, seed, opts.eval_prompts) for m in members}
        for mode in opts.modes:
            if seed_index >= opts.seed_limits.get(mode, len(opts.seeds)):
                continue
            if mode == "none":
                if opts.base is not None:
                    continue  # the runs' own start readings are the untrained cohort
                results += [MemberResult(mode, seed, m, before[m], before[m], 0) for m in members]
                continue
            run_dir = out / "runs" / f"{mode}-seed{seed}"
            done = run_dir / "result.json"
            if done.exists():  # finished by an earlier invocation: an interrupted experiment resumes
                console.print(f"{mode}, seed {seed}: done earlier ({done})")
                earlier = [MemberResult(**r) for r in json.loads(done.read_text())]
                results += earlier
                if opts.base is not None:
                    start_accuracy = start_accuracy or start_readings(earlier)
                if seed == opts.seeds[0]:
                    histories[mode] = load_history(run_dir / "metrics.jsonl")
                continue
            overrides = {
                **opts.overrides,
                "run_id": f"{mode.replace('_', '-')}-s{seed}",
                "reward.mode": mode,
                "training.seed": seed,
                "rounds.max_rounds": opts.rounds,
            }
            # Started by an earlier invocation and stopped before its end: it goes on where it stopped.
            stored = stored_config(run_dir)
            if stored is not None:
                planned = embedded_config(cohort_dir, run_dir, PLANNED_REDIS_URL, base=opts.base, overrides=overrides)
                check_resumable(run_dir, stored, planned)
            console.rule(f"{mode}, seed {seed} ({time.monotonic() - t0:.0f}s elapsed){' resumed' if stored else ''}")
            redis_server = start_redis(run_dir)
            try:
                cfg = embedded_config(cohort_dir, run_dir, redis_server.url, base=opts.base, overrides=overrides)
                run_opts = RunOptions(
                    rounds=opts.rounds,
                    eval_every=opts.eval_every,
                    eval_prompts=opts.eval_prompts,
                    start_accuracy=start_accuracy,
                    resume=stored is not None,
                )
                run = run_embedded(cfg, run_dir, run_opts, console)
            finally:
                redis_server.close()
            if run.interrupted:  # not a finished run: record nothing for it and stop the experiment
                raise KeyboardInterrupt
            history = load_history(run.history)
            if seed == opts.seeds[0]:
                histories[mode] = history
            finished = []
            for m in members:
                if opts.base is not None:  # the servers' own readings, first and last
                    start, end = served_readings(history, m)
                else:
                    final = run_dir / "final" / m
                    weights = final if final.exists() else cohort_dir / m
                    start, end = before[m], _evaluate(weights, seed, opts.eval_prompts)
                finished.append(MemberResult(mode, seed, m, start, end, run.final[m].weight_version or 0))
            done.write_text(json.dumps([dataclasses.asdict(r) for r in finished]))
            if opts.base is not None:
                start_accuracy = start_accuracy or start_readings(finished)
            results += finished
            _write(results, histories, out, opts)
    _write(results, histories, out, opts)
    (out / "experiment.json").write_text(
        json.dumps(
            {
                "modes": list(opts.modes),
                "seeds": list(opts.seeds),
                "rounds": opts.rounds,
                "overrides": opts.overrides,
                "reward": reward_settings(_reward(opts)),  # what the rows are labelled by (corl experiment-table)
                "config": opts.base.run_id if opts.base else None,
                "seconds": round(time.monotonic() - t0, 1),
            },
            indent=2,
        )
    )
    return results


def _reward(opts: ExperimentOptions) -> RewardConfig:
    """The reward section every run of the experiment shares (its mode aside): the config's, overridden."""
    data = opts.base.reward.model_dump(mode="json") if opts.base else {}
    for key, value in opts.overrides.items():
        if key.startswith("reward."):
            set_path(data, key.removeprefix("reward."), value)
    return RewardConfig.model_validate(data)


def _write(results: list[MemberResult], histories: dict[str, list[dict]], out: Path, opts: ExperimentOptions) -> None:
    header = "distinct answers / G (first/last 5 rounds)" if opts.base else "distinct answers / 8"
    write_report(results, histories, out, opts.modes, header)
