"""Samples trained per second: the full pipeline (``corl run``'s embedded processes) vs an
in-process lockstep loop, on the same cohort, batch shape, round count and reward.

    .venv/bin/python bench/pipeline.py [--cohort DIR] [--rounds 20] [--prompts 16] [--samples 8]

Both paths train every member of the cohort on ``rounds`` rounds of ``prompts`` x ``samples``
samples with ``peer_label`` rewards, so both train ``rounds * prompts * samples * members`` samples.

- **lockstep**: one process, one torch thread. Per round every member samples with
  ``corl.models.sampling.sample`` (the function the model servers call), sequentially; the round is
  graded by ``corl.rewards.grade_round`` (what the aggregator calls); each member's batch is encoded
  by the aggregator's own ``graded_batch_json`` into a real ``GradedBatch`` and the member takes one
  ``trainer.policy.PolicyTrainer.step`` on it, the call the trainer loop makes per batch. Sampling
  uses the policy's own weights, so it is exactly on-policy and needs no weight publishing.
- **pipeline**: ``corl.embedded.run.run_embedded``: a real Redis, one model server per member, the
  aggregator and one trainer per member as separate processes, every process limited to one torch
  thread (``CORL_NUM_THREADS``, ``CORL_TRAINER_THREADS``, ``OMP_NUM_THREADS``). The monitor's held-out
  eval is cut to a few prompts, once at the start (and once after the measured window).

Timing (wall clock; loading models and starting processes before the clock starts is excluded):

- *all*: every trained sample over [start, last batch applied]. Lockstep start: after the models
  are loaded. Pipeline start: when servers and aggregator are healthy (``run_embedded``'s monitor
  starts, from ``metrics.jsonl``); the trainers have no health check, so their start-up (imports,
  model load) is inside this window: a conservative number for the pipeline.
- *steady* (the RESULT): the rate once every worker is warm. Lockstep: rounds 1..R-1 over the time
  after round 0; it runs before and after the pipeline and the faster run is the baseline.
  Pipeline: from the moment every trainer has applied its first batch (trainer log lines,
  millisecond stamps), the aggregator's round commits (its log) between the first and the
  last commit after that moment. With ``backpressure: wait`` a round is committed only when every
  trainer holds fewer than ``max_pending_batches`` unacknowledged batches, so the commit rate is
  the rate the slowest trainer applies batches at; counting applied batches from that moment
  instead would credit the window with rounds generated before it (printed too, for reference;
  that window also holds the final drain).

With 2 CPU cores shared by ~10 pipeline processes (and whatever else runs on the machine), the
numbers say what this machine does, not what the design can do with a core per process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
import zlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

REWARD_MODE = "peer_label"
_LOG_TIME = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
_STEP_RE = re.compile(_LOG_TIME + r" INFO \S+: step (\d+) batch (\S+): ")
_DROP_RE = re.compile(_LOG_TIME + r" INFO \S+: dropping batch (\S+)")
_ROUND_RE = re.compile(_LOG_TIME + r" INFO \S+: round (\d+): batches for")


@dataclass
class PathResult:
    name: str
    samples: int  # trained samples in the whole run
    all_seconds: float
    steady_samples: int
    steady_seconds: float
    notes: list[str]

    @property
    def all_rate(self) -> float:
        return self.samples / self.all_seconds

    @property
    def steady_rate(self) -> float:
        return self.steady_samples / self.steady_seconds


def _default_cohort() -> Path:
    return Path("/tmp/cohort-tiny") if Path("/tmp/cohort-tiny/cohort.json").exists() else Path("cohort/tiny")


_EXTRA: dict[str, object] = {}  # --set KEY=VALUE overrides, for both paths


def _overrides(rounds: int, prompts: int, samples: int) -> dict:
    return {
        **_EXTRA,
        "rounds.prompts_per_round": prompts,
        "rounds.samples_per_prompt": samples,
        "rounds.max_rounds": rounds,
        "reward.mode": REWARD_MODE,
    }


def _parse_set(item: str) -> tuple[str, object]:
    key, _, raw = item.partition("=")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def _seed(run: str, round_: int, member: str) -> int:
    # As the aggregator seeds each (run, round, member) generate call.
    return zlib.crc32(f"{run}:{round_}:{member}".encode()) & 0x7FFFFFFF


# -- lockstep ------------------------------------------------------------------------------------


def run_lockstep(cohort: Path, rounds: int, prompts: int, samples: int) -> PathResult:
    import torch

    from corl.embedded.config import embedded_config
    from corl.models.sampling import sample
    from corl.proto import GenerateResponse, GradedBatch
    from corl.rewards import grade_round
    from corl.services.aggregator.batches import graded_batch_json
    from corl.tasks import get_task
    from corl.trainer.policy import PolicyTrainer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="corl-bench-lockstep-") as tmp:
        cfg = embedded_config(cohort, Path(tmp), "redis://unused:0/0", overrides=_overrides(rounds, prompts, samples))
    rc, sp = cfg.rounds, cfg.sampling()
    task = get_task(cfg.task.name)
    pool = task.splits(rc.prompt_source.seed).rl
    names = [m.name for m in cfg.members]
    policies = {n: PolicyTrainer(cfg, n, torch.device("cpu")) for n in names}
    versions = dict.fromkeys(names, 0)

    t0 = time.perf_counter()
    round_ends: list[float] = []
    for r in range(rounds):
        examples = [pool[(r * prompts + i) % len(pool)] for i in range(prompts)]
        texts = [e.prompt for e in examples]
        responses = {}
        for n, p in policies.items():  # as the model servers answer: sampler output in a GenerateResponse
            out = sample(
                p.model,
                p.tokenizer,
                texts,
                n=samples,
                max_tokens=sp.max_tokens,
                temperature=sp.temperature,
                top_p=sp.top_p,
                stop=sp.stop,
                seed=_seed(cfg.run_id, r, n),
            )
            results = [
                {"prompt": t, "prompt_token_ids": pc.prompt_token_ids, "samples": pc.completions}
                for t, pc in zip(texts, out, strict=True)
            ]
            responses[n] = GenerateResponse.model_validate(
                {"model": n, "weight_version": versions[n], "results": results}, from_attributes=True
            )
        # The aggregator's own grading and batch encoding.
        outcome = grade_round(
            responses, task, cfg.reward, {}, order=names, dataset_answers=[e.answer for e in examples]
        )
        for n, p in policies.items():
            raw = graded_batch_json(
                cfg.run_id, r, n, cfg.reward.mode, sp, responses[n], outcome.members[n], time.time()
            )
            stats = p.step(GradedBatch.model_validate_json(raw))
            versions[n] += 1 if stats.sequences else 0
        round_ends.append(time.perf_counter())
    total = round_ends[-1] - t0
    per_round = prompts * samples * len(names)
    steady = (rounds - 1) * per_round, round_ends[-1] - round_ends[0]
    notes = [
        f"round 0 took {round_ends[0] - t0:.2f}s; mean of rounds 1..{rounds - 1}: "
        f"{steady[1] / max(rounds - 1, 1):.2f}s",
    ]
    return PathResult("lockstep", rounds * per_round, total, steady[0], steady[1], notes)


# -- pipeline ------------------------------------------------------------------------------------


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def run_pipeline(cohort: Path, rounds: int, prompts: int, samples: int, run_dir: Path) -> PathResult:
    from rich.console import Console

    from corl.embedded.config import embedded_config
    from corl.embedded.run import RunOptions, run_embedded, start_redis

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CORL_NUM_THREADS", "CORL_TRAINER_THREADS"):
        os.environ[var] = "1"
    redis_server = start_redis(run_dir)
    try:
        cfg = embedded_config(cohort, run_dir, redis_server.url, overrides=_overrides(rounds, prompts, samples))
        opts = RunOptions(rounds=rounds, eval_every=10**9, eval_prompts=8, poll_s=0.5)
        result = run_embedded(cfg, run_dir, opts, Console(quiet=True))
    finally:
        redis_server.close()
    names = [m.name for m in cfg.members]
    per_batch = prompts * samples

    rows = [json.loads(line) for line in result.history.read_text().splitlines() if line.strip()]
    healthy = rows[0]["time"] - rows[0]["elapsed_s"]
    steps: dict[str, list[float]] = {}
    dropped: dict[str, int] = {}
    for n in names:
        log_text = (run_dir / "logs" / f"trainer-{n}.log").read_text(errors="replace")
        steps[n] = sorted(_stamp(m.group(1)) for m in _STEP_RE.finditer(log_text))
        dropped[n] = len(_DROP_RE.findall(log_text))
    agg_text = (run_dir / "logs" / "aggregator.log").read_text(errors="replace")
    round_times = sorted(_stamp(m.group(1)) for m in _ROUND_RE.finditer(agg_text))
    counts = {n: len(s) for n, s in steps.items()}
    if not all(counts.values()):
        raise RuntimeError(f"a trainer applied no batch: {counts}; see {run_dir}")

    applied = sum(len(s) for s in steps.values())
    last = max(s[-1] for s in steps.values())
    ready = max(s[0] for s in steps.values())  # every trainer has applied its first batch
    after = [t for t in round_times if t > ready]
    if len(after) < 2:
        raise RuntimeError(f"only {len(after)} rounds were committed after every trainer was up: use more --rounds")
    # Steady state: round commits after the trainers are up. Back-pressure ("wait", at most
    # max_pending_batches unacknowledged batches per member) ties the commit rate to the slowest
    # trainer, and the queues are full at both ends of this window, so no pre-generated round is
    # counted as work of the window.
    steady_rounds, steady_s = len(after) - 1, after[-1] - after[0]
    applied_after = sum(1 for s in steps.values() for t in s if t > ready)
    notes = [
        f"batches applied per member: {counts}; stale-dropped: {dropped}",
        f"every trainer had applied its first batch {ready - healthy:.1f}s after healthy (trainer start-up); "
        f"{len(round_times) - len(after)} of {len(round_times)} rounds were committed by then",
        f"steady window: {steady_rounds} round commits in {steady_s:.1f}s "
        f"({steady_s / steady_rounds:.2f}s per round); by batches applied after that moment instead (counts "
        f"rounds queued before it, times the final drain): {applied_after * per_batch / (last - ready):.1f} samples/s",
        f"rounds reported by the monitor: {result.rounds}; run dir {run_dir}",
    ]
    steady_samples = steady_rounds * len(names) * per_batch
    return PathResult("pipeline", applied * per_batch, last - healthy, steady_samples, steady_s, notes)


# -- main ----------------------------------------------------------------------------------------


def _report(res: PathResult) -> None:
    print(
        f"{res.name:9s} trained {res.samples} samples: all {res.all_rate:7.1f} samples/s "
        f"({res.all_seconds:.1f}s); steady {res.steady_rate:7.1f} samples/s "
        f"({res.steady_samples} samples in {res.steady_seconds:.1f}s)"
    )
    for n in res.notes:
        print(f"          {n}")


def _load(what: str) -> None:
    print(f"load average before {what}: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cohort", type=Path, default=_default_cohort())
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--run-dir", type=Path, default=None, help="Pipeline run directory (default: a temp dir).")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Config override for both paths, e.g. rounds.max_pending_batches=4 (repeatable).",
    )
    args = ap.parse_args()
    _EXTRA.update(_parse_set(item) for item in args.set)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the steady-state rate leaves out the first round)")
    cohort = args.cohort.resolve()
    n_members = len(json.loads((cohort / "cohort.json").read_text())["members"])
    expected = args.rounds * args.prompts * args.samples * n_members
    print(
        f"cohort {cohort} ({n_members} members, all trained), reward {REWARD_MODE}, {args.rounds} rounds x "
        f"{args.prompts} prompts x {args.samples} samples = {expected} trained samples per path; "
        f"1 torch thread in the lockstep process and in every pipeline process; {os.cpu_count()} CPUs"
        + (f"; overrides {_EXTRA}" if _EXTRA else "")
    )
    t0 = time.perf_counter()
    # Lockstep runs before and after the pipeline and the faster of the two is the baseline: on a
    # machine shared with other work a single A/B pair mostly measures the neighbours' load, and
    # taking the better lockstep run errs against the pipeline.
    _load("lockstep #1")
    locks = [run_lockstep(cohort, args.rounds, args.prompts, args.samples)]
    _report(locks[0])
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="corl-bench-pipeline-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    _load("pipeline")
    pipe = run_pipeline(cohort, args.rounds, args.prompts, args.samples, run_dir.resolve())
    _report(pipe)
    _load("lockstep #2")
    locks.append(run_lockstep(cohort, args.rounds, args.prompts, args.samples))
    _report(locks[1])
    lock = max(locks, key=lambda r: r.steady_rate)
    print(f"baseline: the faster lockstep run ({lock.steady_rate:.1f} samples/s steady)")
    if pipe.samples != expected:
        print(f"WARNING: the pipeline trained {pipe.samples} samples, not {expected}: its rates are not comparable")
    print(f"all-in ratio (pipeline incl. trainer start-up): {pipe.all_rate / lock.all_rate:.3f}")
    print(f"bench wall time {time.perf_counter() - t0:.0f}s")
    print(f"RESULT pipeline_over_lockstep={pipe.steady_rate / lock.steady_rate:.3f}")


if __name__ == "__main__":
    main()
