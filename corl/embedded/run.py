"""``corl run``: Redis, one model server per member, the aggregator and one trainer per trained
member, as local processes; live progress; a run directory with logs, metrics and final weights."""

from __future__ import annotations

import copy
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from rich.console import Console
from rich.live import Live

from corl import redis_keys
from corl.config import CohortConfig
from corl.heldout import HeldoutReader, client_timeout, is_due, tracking_record, write_reading
from corl.placement import Plan
from corl.proto import HeldoutAccuracy, MemberRoundStats, RoundStats, RunStats
from corl.redis_auth import redis_auth
from corl.redis_server import LocalRedis, free_port
from corl.services.http import bearer_headers
from corl.streams import group_backlog
from corl.tracking import Outcome, Tracking, build_tracking

from .processes import ChildDied, ProcessGroup, RestartPolicy
from .progress import MemberSnapshot, MetricsHistory, RoundLog, RunSnapshot, render, summary_line
from .resume import resume_line, resume_point, wait_batches_applied
from .start import start_services

log = logging.getLogger(__name__)


def service_urls(agg_url: str, gateway_url: str | None = None) -> str:
    """The lines ``corl run`` prints at start: where to watch the run and where to plug in."""
    lines = f"dashboard:  {agg_url}/dashboard\naggregator: {agg_url}  (graders, /get_reward, /v1/reward, /metrics)"
    if gateway_url:
        lines += f"\ngateway:    {gateway_url}/v1  (your agents' OpenAI base_url; api key: CORL_COHORT_TOKEN)"
    return lines


@dataclass
class RunOptions:
    rounds: int | None = 40
    eval_every: int = 10  # evaluate held-out accuracy every this many weight versions
    eval_prompts: int = 200
    poll_s: float = 2.0
    ready_timeout_s: float = 300.0
    drain_timeout_s: float = 600.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)  # what happens when a child dies
    # Held-out readings of the starting weights, member -> reading, when already taken (an experiment's
    # earlier run of the same cohort, problems and greedy decoding): recorded instead of read again.
    start_accuracy: dict[str, HeldoutAccuracy] | None = None
    # Continue the run already in the run directory (its Redis, checkpoints, weights and history).
    resume: bool = False
    # The device plan every server and trainer follows (CUDA_VISIBLE_DEVICES, a vLLM server's memory
    # share: ``corl.placement``); None sets no devices.
    placement: Plan | None = None


@dataclass
class RunResult:
    run_dir: Path
    rounds: int
    final: dict[str, MemberSnapshot]
    history: Path
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM before its rounds were done


class RunMonitor:
    """Polls the services for a snapshot; reads held-out accuracy through the servers when due
    (``corl.heldout``, the evaluator service's rule and reader)."""

    def __init__(
        self,
        cfg: CohortConfig,
        agg_url: str,
        opts: RunOptions,
        tracking: Tracking | None = None,
        cohort_token: str | None = None,
    ):
        self.cfg, self.agg_url, self.opts = cfg, agg_url, opts
        self.tracking = tracking or Tracking()
        self.http = httpx.Client(timeout=client_timeout(cfg), headers=bearer_headers(cohort_token))
        self.reader = HeldoutReader(cfg, self.http, opts.eval_prompts)
        self.redis = redis.Redis.from_url(cfg.redis_url, **redis_auth(), socket_timeout=5.0)
        self.last: dict[str, MemberSnapshot] = {m.name: MemberSnapshot() for m in cfg.members}
        self.rounds: list[RoundStats] = []  # the newest rounds the aggregator reported
        self.t0 = time.monotonic()

    def close(self) -> None:
        self.http.close()
        self.redis.close()

    def backlog(self, member: str) -> int | None:
        """Batches waiting for the member's trainer; ``None`` when Redis does not answer in time (a
        loaded machine can stall it for seconds: the view shows "-", the run goes on)."""
        stream = redis_keys.batches_stream(self.cfg.run_id, member)
        try:
            counts = group_backlog(self.redis, stream, redis_keys.TRAINER_GROUP)
        except redis.RedisError as err:
            log.warning("backlog of %s not read: %s", member, err)
            return None
        return sum(counts) if counts else None

    def snapshot(self, force_eval: bool = False) -> RunSnapshot:
        stats = self._stats()
        latest = stats.rounds[-1].members if stats and stats.rounds else {}
        for m in self.cfg.members:
            snap = self.last[m.name]
            if m.endpoint is not None:
                self._round_figures(snap, latest.get(m.name))  # no weights to read, no held-out eval: not corl's
                continue
            try:
                snap.weight_version = self.reader.served_version(m)
            except (httpx.HTTPError, ValueError):
                pass
            self._round_figures(snap, latest.get(m.name))
            snap.collapse_alarm = bool(stats and m.name in stats.collapse)
            snap.backlog = self.backlog(m.name) if m.role == "trained" else None
            due = force_eval or is_due(snap.accuracy_version, snap.weight_version, self.opts.eval_every)
            if due and self.reader.examples:  # a task with no held-out problems (harvested chat) is not read
                try:
                    reading = self.reader.evaluate(m)
                except httpx.HTTPError as err:
                    log.warning("held-out eval of %s failed: %s", m.name, err)
                else:
                    self.take_reading(snap, reading)
                    self.report_heldout(m.name, reading)
        rounds = stats.next_round if stats else 0
        return RunSnapshot(elapsed_s=time.monotonic() - self.t0, rounds=rounds, members=copy.deepcopy(self.last))

    @staticmethod
    def _round_figures(snap: MemberSnapshot, last: MemberRoundStats | None) -> None:
        if last is not None:
            snap.mean_reward = last.mean_reward
            snap.distinct_answers = last.distinct_answers
            snap.label_rate = last.label_rate
            snap.label_accuracy = last.label_accuracy
            snap.reward_accuracy = last.reward_accuracy
            snap.majority_ratio = last.majority_ratio
            snap.label_share = last.label_share

    def restore(self, snap: RunSnapshot) -> None:
        """Go on from a stopped run's last snapshot: its held-out readings stand (the next one is due
        ``eval_every`` versions after the last one taken) and its clock keeps counting."""
        for name, m in snap.members.items():
            if name in self.last:
                self.last[name] = copy.deepcopy(m)
        self.t0 = time.monotonic() - snap.elapsed_s

    @staticmethod
    def take_reading(snap: MemberSnapshot, reading: HeldoutAccuracy) -> None:
        snap.accuracy, snap.accuracy_version = reading.accuracy, reading.weight_version
        snap.parsed, snap.formatted = reading.parsed, reading.formatted

    def record_start(self, readings: dict[str, HeldoutAccuracy]) -> None:
        """Take the starting weights' held-out readings as given (version 0 of every member)."""
        for m in self.cfg.served_members():
            reading = readings[m.name].model_copy(update={"weight_version": 0, "at": time.time()})
            self.take_reading(self.last[m.name], reading)
            self.report_heldout(m.name, reading)

    def report_heldout(self, member: str, reading: HeldoutAccuracy) -> None:
        """Share the reading with the aggregator's stats and dashboard (the run's held-out hash; best
        effort) and the experiment trackers."""
        self.tracking.log(tracking_record(member, reading))
        try:
            write_reading(self.redis, self.cfg.run_id, member, reading)
        except redis.RedisError as err:
            log.warning("could not record held-out accuracy of %s: %s", member, err)

    def _stats(self) -> RunStats | None:
        try:
            r = self.http.get(f"{self.agg_url}/v1/runs/{self.cfg.run_id}/stats", params={"last": RoundLog.POLL_ROUNDS})
            stats = RunStats.model_validate_json(r.content) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        self.rounds = stats.rounds if stats else []
        return stats


def _drained(snap: RunSnapshot, cfg: CohortConfig, target: int | None) -> bool:
    if target is None or snap.rounds < target:
        return False
    return all(snap.members[m.name].backlog in (0, None) for m in cfg.members if m.role == "trained")


def run_embedded(cfg: CohortConfig, run_dir: Path, opts: RunOptions, console: Console | None = None) -> RunResult:
    """Run the loop until ``opts.rounds`` rounds are produced and trained on (or Ctrl-C); with
    ``opts.resume``, go on with the run already in ``run_dir`` (its rounds count toward ``opts.rounds``)."""
    console = console or Console()
    # One admin token per run (trainers push weights into the servers with it), and one cohort token
    # (generate, grade, the OpenAI routes: the aggregator and this monitor call them with it).
    token = os.environ.get("CORL_ADMIN_TOKEN") or secrets.token_urlsafe(24)
    cohort_token = os.environ.get("CORL_COHORT_TOKEN") or secrets.token_urlsafe(24)
    group = ProcessGroup(
        run_dir / "logs",
        env={
            "CORL_LOG_LEVEL": "INFO",
            "CORL_ADMIN_TOKEN": token,
            "CORL_COHORT_TOKEN": cohort_token,
            "CORL_TASKS": cfg.task.name,  # the servers grade the run's task, nothing else
            **cfg.sandbox.env(),
        },
        restart=opts.restart,
    )
    history = MetricsHistory(run_dir / "metrics.jsonl")
    round_log = RoundLog(run_dir / "rounds.jsonl")
    resumed = history.last() if opts.resume else None  # None: no snapshot yet, the start reading is due
    monitor: RunMonitor | None = None
    tracking = build_tracking(cfg, "supervisor", ends_run=True)  # held-out readings as they come
    snap = resumed or RunSnapshot(elapsed_s=0.0, rounds=0)
    interrupted = False
    outcome: Outcome = "finished"  # as the trackers record the run's end
    try:
        if opts.resume:
            console.print(resume_line(cfg, resume_point(cfg), opts.rounds), highlight=False, soft_wrap=True)
        port = free_port()
        # Printed before the (slow) start, so a person can open the dashboard while it comes up.
        console.print(service_urls(f"http://127.0.0.1:{port}", cfg.gateway.url), highlight=False, soft_wrap=True)
        monitor = reader = RunMonitor(cfg, f"http://127.0.0.1:{port}", opts, tracking, cohort_token)
        with console.status("starting servers, aggregator and trainers...") as status:

            def start_reading() -> None:  # held-out accuracy of the untrained cohort, before any round
                if resumed is not None:  # the run's history goes on; its start reading was taken
                    reader.restore(resumed)
                elif opts.start_accuracy is not None:
                    reader.record_start(opts.start_accuracy)
                    history.append(reader.snapshot())
                else:
                    status.update("held-out accuracy of the starting weights...")
                    history.append(reader.snapshot(force_eval=True))
                status.update("starting the trainers...")

            def catch_up() -> None:
                if opts.resume:
                    status.update("trainers applying the batches the stop left behind...")
                    wait_batches_applied(cfg, opts.drain_timeout_s, alive=group.check)
                status.update("starting the aggregator...")

            start_services(cfg, run_dir, group, port, start_reading, catch_up, opts.placement)
        console.print(f"all services healthy; logs in {group.log_dir}")
        deadline: float | None = None
        live_view = console.is_terminal  # in logs the live table never draws: a line per round instead
        printed = 0
        with Live(render(snap, opts.rounds), console=console, refresh_per_second=2, transient=not live_view) as live:
            while True:
                group.check()
                snap = monitor.snapshot()
                history.append(snap)
                round_log.extend(monitor.rounds)
                live.update(render(snap, opts.rounds))
                if not live_view and snap.rounds > printed:
                    printed = snap.rounds
                    console.print(summary_line(snap, opts.rounds), highlight=False, soft_wrap=True)
                if opts.rounds is not None and snap.rounds >= opts.rounds:
                    deadline = deadline or time.monotonic() + opts.drain_timeout_s
                    if _drained(snap, cfg, opts.rounds) or time.monotonic() > deadline:
                        break
                time.sleep(opts.poll_s)
        # Let the trainers publish what they applied last, then take a final reading.
        time.sleep(opts.poll_s)
        snap = monitor.snapshot(force_eval=True)
        history.append(snap)
        console.print(render(snap, opts.rounds))
        if group.restarts:
            console.print(f"restarted under on-failure: {group.restarts}", highlight=False)
    except ChildDied as err:
        outcome = "failed"
        console.print(f"[red]{err.name} died (exit code {err.returncode}); last lines of its log:[/red]")
        console.print(err.log_tail, markup=False, highlight=False)
        raise
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process[/yellow]")
        interrupted, outcome = True, "killed"
    finally:
        if monitor:
            monitor.close()
        group.stop()
        tracking.close(outcome)
        if tracking.errors():
            console.print(f"tracking failed (the run went on without it): {tracking.errors()} calls", highlight=False)
    _collect_final_weights(cfg, run_dir)
    return RunResult(run_dir, snap.rounds, snap.members, history.path, interrupted)


def _collect_final_weights(cfg: CohortConfig, run_dir: Path) -> None:
    """Link each member's newest published version as ``final/<member>``."""
    final = run_dir / "final"
    final.mkdir(exist_ok=True)
    for m in cfg.members:
        store = Path(cfg.weights_dir) / m.name
        versions = sorted((p for p in store.glob("v*") if p.is_dir()), key=lambda p: int(p.name.lstrip("v") or 0))
        if versions:
            dest = final / m.name
            if dest.exists() or dest.is_symlink():
                dest.unlink() if dest.is_symlink() else shutil.rmtree(dest)
            dest.symlink_to(versions[-1].resolve(), target_is_directory=True)


def start_redis(run_dir: Path) -> LocalRedis:
    """The run's own Redis, its append-only file in ``run_dir/redis``: a restart (``--resume``) replays it.

    ``appendfsync everysec``: every acknowledged write is in the file (the OS page cache) before
    Redis answers, so a kill -9 of any or all of the run's processes loses nothing; only an OS
    crash or power cut, or a disk stalled long enough for Redis to postpone a write, can lose the
    last second or two. The run is built to redo such a loss idempotently: a lost round commit
    (atomic: counter, cursor, learnt state and batches together) is redone with the same prompts
    and the same batch ids, which trainers recognise from the applied ids in their fsynced
    checkpoints and acknowledge without training; a lost acknowledgement re-delivers a batch the
    same way; weight versions are numbered above both Redis's record and the weights store. So
    ``always`` (an fsync before every reply, on the path of every round and trainer read) would buy
    no guarantee the run needs."""
    return LocalRedis(data_dir=run_dir / "redis", appendfsync="everysec").start()
