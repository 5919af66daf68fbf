"""Continuing a stopped or crashed embedded run from its run directory.

Everything a run needs to go on is durable there: the round counter, prompt cursor, learnt state
and unacknowledged batches in the run's Redis (its append-only file), each trainer's checkpoints
(step, optimizer, the batch ids already applied) and the weights store. Resuming starts the same
processes on them (each trainer resumes from its newest checkpoint and brings its member's servers
to the newest published version, or republishes above it). This module adds what only the
supervisor can do: refuse a config that would break the run, say where the run stands, and hold
the rounds back until the trainers have applied what the stop left in their streams.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from corl import redis_keys
from corl.config import CohortConfig, ConfigError, load_config
from corl.redis_auth import redis_auth
from corl.streams import group_backlog
from corl.trainer.publish import WeightsStore

log = logging.getLogger(__name__)

CONFIG_FILE = "cohort.yaml"  # the config every process of the run reads, written in its run directory


class ResumeRefused(RuntimeError):
    """The run cannot be continued as asked; the message says why."""


def stored_config(run_dir: Path) -> CohortConfig | None:
    """The config the run in ``run_dir`` was started with; None when no run got that far there."""
    path = run_dir / CONFIG_FILE
    if not path.exists():
        return None
    try:
        return load_config(path)
    except ConfigError as err:
        raise ResumeRefused(f"{path} is not a usable cohort config: {err}") from None


def config_changes(before: CohortConfig, now: CohortConfig) -> list[str]:
    """What changed between the run's config and the one given now that the run's stored state
    cannot follow: its id (its Redis keys), the members (names, models, roles: their streams,
    checkpoints and weights), the task and its prompts (the prompt cursor), the reward mode and
    LoRA on or off and the size of a member's trainer group (the checkpoints' layout: a group resumes
    from its sharded checkpoints at the size that wrote them). Anything else (rounds, evaluation, learning rates)
    may change between starts."""
    changes: list[str] = []
    if before.run_id != now.run_id:
        changes.append(f"run_id: {before.run_id} -> {now.run_id}")
    old, new = {m.name: m for m in before.members}, {m.name: m for m in now.members}
    if removed := [n for n in old if n not in new]:
        changes.append(f"members removed: {', '.join(removed)}")
    if added := [n for n in new if n not in old]:
        changes.append(f"members added: {', '.join(added)}")
    for name in (n for n in old if n in new):
        for field in ("model", "role", "trainer_processes"):
            a, b = getattr(old[name], field), getattr(new[name], field)
            if a != b:
                changes.append(f"member {name} {field}: {a} -> {b}")
    sections = (
        ("task", before.task.model_dump(), now.task.model_dump()),
        ("rounds.prompt_source", before.rounds.prompt_source.model_dump(), now.rounds.prompt_source.model_dump()),
    )
    for section, a, b in sections:
        changes += [f"{section}.{k}: {a[k]} -> {b[k]}" for k in a if a[k] != b[k]]
    if before.reward.mode != now.reward.mode:
        changes.append(f"reward.mode: {before.reward.mode} -> {now.reward.mode}")
    if (before.training.lora is None) != (now.training.lora is None):
        on_off = "on" if now.training.lora else "off"
        changes.append(f"training.lora: turned {on_off}")
    return changes


def still_running(run_dir: Path, before: CohortConfig) -> int | None:
    """The process id of the Redis of the run's last start when it still serves ``run_dir`` (its
    supervisor was killed alone, say): a second Redis on the same append-only file would corrupt it."""
    client = redis.Redis.from_url(before.redis_url, **redis_auth(), socket_connect_timeout=1.0, socket_timeout=2.0)
    try:
        served = client.config_get("dir").get("dir")
        pid = client.info("server").get("process_id")
    except redis.RedisError:
        return None
    finally:
        client.close()
    return pid if served is not None and Path(served).resolve() == (run_dir / "redis").resolve() else None


def check_resumable(run_dir: Path, before: CohortConfig, now: CohortConfig) -> None:
    """Raise ``ResumeRefused`` when the run in ``run_dir`` is still running, or naming every config
    change that breaks it (``before``: its stored config, ``now``: the one given)."""
    if pid := still_running(run_dir, before):
        raise ResumeRefused(
            f"cannot resume {run_dir}: its Redis (process {pid}, {before.redis_url}) is still running; "
            "stop what is left of the run (or wait for it to end) first."
        )
    changes = config_changes(before, now)
    if changes:
        listed = "\n".join(f"  - {c}" for c in changes)
        raise ResumeRefused(
            f"cannot resume {run_dir}: the config changed in a way the run cannot follow:\n{listed}\n"
            "Resume with the run's own config (its cohort.yaml is used when no --config is given), "
            "or start a new run in another directory."
        )


@dataclass(frozen=True)
class ResumePoint:
    next_round: int  # rounds already committed (the aggregator's durable counter)
    versions: dict[str, int]  # trained member -> newest published weight version (0: none yet)


def resume_point(cfg: CohortConfig) -> ResumePoint:
    """Where the run stands, read from its Redis and weights store."""
    client = redis.Redis.from_url(cfg.redis_url, **redis_auth(), socket_timeout=10.0)
    try:
        raw = client.hget(redis_keys.round_state(cfg.run_id), "next_round")
    finally:
        client.close()
    return ResumePoint(int(raw) if raw is not None else 0, newest_versions(cfg))


def newest_versions(cfg: CohortConfig) -> dict[str, int]:
    """Each trained member's newest published version in the run's weights store (0: none)."""
    return {m.name: WeightsStore(cfg.weights_dir, m.name).latest_version() for m in cfg.members if m.role == "trained"}


def resume_line(cfg: CohortConfig, point: ResumePoint, target: int | None) -> str:
    versions = ", ".join(f"{name} v{v}" for name, v in point.versions.items()) or "-"
    return f"resuming run {cfg.run_id} at round {point.next_round} of {target or '-'}, versions: {versions}"


class _BatchesLeft(Exception):
    pass


def wait_batches_applied(cfg: CohortConfig, timeout_s: float, *, alive: Callable[[], None]) -> bool:
    """Wait until no trained member's stream holds a batch its trainer has not applied (a fresh
    run's streams hold none); ``alive()`` raises when a process died. False when ``timeout_s``
    passed first (the run goes on: batches sampled meanwhile may then come out stale).

    A stopped run leaves batches behind: the rounds its trainers had not read, and the ones they
    applied after their last checkpoint, which they apply again from it. Rounds resume once these
    are trained, so the next one is sampled on the weights they lead to; sampled earlier, behind
    a backlog longer than ``training.max_staleness``, it would be dropped as stale."""
    client = redis.Redis.from_url(cfg.redis_url, **redis_auth(), socket_timeout=10.0)
    streams = {m.name: redis_keys.batches_stream(cfg.run_id, m.name) for m in cfg.members if m.role == "trained"}
    try:
        for attempt in Retrying(
            stop=stop_after_delay(timeout_s),
            wait=wait_fixed(0.5),
            retry=retry_if_exception_type(_BatchesLeft),
            reraise=True,
        ):
            with attempt:
                alive()
                left = {m: sum(group_backlog(client, s, redis_keys.TRAINER_GROUP) or ()) for m, s in streams.items()}
                if any(left.values()):
                    raise _BatchesLeft(left)
    except _BatchesLeft as err:
        log.warning("rounds resume with batches not yet applied after %.0fs: %s", timeout_s, err)
        return False
    finally:
        client.close()
    return True
