"""The trainer main loop: read a batch, maybe drop it, take a step, publish, checkpoint, acknowledge.

Durability: a batch's stream entry is acknowledged (together with recording its id as applied) only
after a checkpoint containing its step is on disk. Unacknowledged entries are flushed with a
checkpoint every ``checkpoint_every`` steps, whenever the stream is idle (the aggregator's
back-pressure counts pending entries, so holding them would stall it), and on shutdown. After a
crash the trainer resumes from the newest checkpoint and re-reads what is still pending; ids already
in the checkpoint are acknowledged without training. Weight versions come from a counter that is
the maximum of the checkpoint, the weights store and Redis, so a version is never reused; the jump
that makes over steps lost in a crash is not counted as staleness (see ``staleness``).

Publishing (``training.weight_transfer``): by broadcast, a background thread takes a CPU snapshot of
the weights in the servers' dtype beside the next step (whose optimizer step waits for it; a trainer
group takes it in step), broadcasts it to the member's weight group, then
writes the version's files from the same snapshot and brings every replica the broadcast missed up
from them. A broadcast version is announced in Redis before it is sent (no restarted trainer reuses
its number) and counts as published once its files exist. Where no replica can join a group, and for
LoRA adapters, a version goes by files as before: written, checksummed, pushed, all in the step.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import redis
import torch

from corl.config import CohortConfig
from corl.tracking import Record, Tracking, build_tracking

from .batches import BatchStream, Entry, trainer_redis
from .broadcast import WeightBroadcaster
from .checkpoint import Checkpointer, TrainerState
from .group import GroupLeader, build_policy
from .metrics import TrainerMetrics
from .policy import PolicyTrainer
from .publish import Published, ReplicaPusher, WeightsStore
from .publishing import Publishing
from .settings import TrainerSettings
from .sharding import Sharding
from .staleness import Renumbering, version_lag

log = logging.getLogger(__name__)


class Trainer(Publishing):
    """One member's trainer process: Redis in, weights out, durable in between."""

    def __init__(
        self,
        cfg: CohortConfig,
        member: str,
        settings: TrainerSettings | None = None,
        *,
        redis_client: redis.Redis | None = None,
        http: httpx.Client | None = None,
        metrics: TrainerMetrics | None = None,
        tracking: Tracking | None = None,
        sharding: Sharding | None = None,
    ):
        """``sharding``: this is rank 0 of the member's trainer group (the other ranks ``follow``)."""
        self.cfg, self.member, self.sharding = cfg, member, sharding
        self.settings = settings or TrainerSettings()
        mcfg = cfg.member(member)
        if mcfg.role != "trained":
            raise ValueError(f"member {member!r} is frozen: it has no trainer")
        self.metrics = metrics or TrainerMetrics(member)
        # Experiment trackers (tracking.report_to): step stats go there from a thread of their own.
        self.tracking = tracking or build_tracking(cfg, f"trainer-{member}", self.metrics.registry)
        self.redis = redis_client or trainer_redis(cfg.redis_url)
        self.http = http or httpx.Client(timeout=httpx.Timeout(self.settings.http_timeout_s, connect=5.0))
        self.stream = BatchStream(
            self.redis,
            cfg.run_id,
            member,
            self.settings.consumer_name(member),
            delete_acked=not self.settings.keep_acked,
        )
        self.store = WeightsStore(cfg.weights_dir, member, keep=cfg.training.keep_versions)
        self.checkpointer = Checkpointer(cfg.checkpoints_dir, member, keep=self.settings.keep_checkpoints)
        self.pusher = ReplicaPusher(
            mcfg.servers, self.settings.admin_token, self.http, attempts=self.settings.publish_attempts
        )
        self.transfer = "files" if cfg.training.lora else cfg.training.weight_transfer
        self.broadcaster: WeightBroadcaster | None = None  # built by setup() (it needs the policy's device)
        self._publisher = ThreadPoolExecutor(1, thread_name_prefix="corl-publish")
        self._publishing: Future[None] | None = None
        self._snapshot: dict[str, torch.Tensor] | None = None  # reused: one buffer, faulted in once
        self._transfer_shown: str | None = None
        self._stop = False
        self._metrics_server: Any = None
        # Filled by setup():
        self.policy: PolicyTrainer | GroupLeader
        self.state = TrainerState()
        self._applied: deque[str] = deque(maxlen=self.settings.applied_ids_kept)
        self._applied_set: set[str] = set()
        self._uncommitted: list[tuple[str, str | None]] = []  # (entry id, batch id or None for a duplicate)
        self._unpublished = 0
        self._last_sync = self._last_claim = 0.0
        self.latest: Published | None = None
        self.renumbering: Renumbering | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def setup(self) -> None:
        if self.settings.threads:
            torch.set_num_threads(self.settings.threads)
        ckpt = self.checkpointer.latest()
        self.policy = build_policy(self.cfg, self.member, self.settings, ckpt, self.sharding)
        mcfg = self.cfg.member(self.member)
        if self.transfer == "broadcast" and mcfg.servers:
            own = self.policy.policy if isinstance(self.policy, GroupLeader) else self.policy
            tp = mcfg.vllm.tensor_parallel_size if mcfg.backend == "vllm" else 1
            self.broadcaster = WeightBroadcaster(
                self.member, mcfg.servers, self.http, self.pusher.headers, self.settings, own.device, self.metrics, tp
            )
        if ckpt is not None:
            self.state = self.checkpointer.load_state(ckpt)
            for bid in self.state.applied:
                self._remember(bid)
            st = self.state
            log.info("resumed %s from %s: step %d, version %d", self.member, ckpt.name, st.step, st.weight_version)
        self.stream.ensure_group()
        self.stream.claim_dead(self.settings.claim_idle_ms)
        self._last_claim = time.monotonic()
        newest = max(self.store.latest_version(), self.stream.published_version(), self.stream.announced_version())
        if newest > self.state.weight_version or (newest and newest not in self.store.versions()):
            # Versions newer than the checkpoint came from steps lost in a crash (or the newest folder is
            # gone): the servers must move to this lineage, under a fresh, higher version number.
            checkpoint_version, self.state.weight_version = self.state.weight_version, newest
            log.info("published version %d is newer than the checkpoint's %d: republishing", newest, checkpoint_version)
            self.publish()
            self.renumbering = Renumbering(newest, checkpoint_version, self.state.weight_version)
        elif newest > 0:
            self.latest = self.store.get(newest, self.policy.format)  # type: ignore[arg-type]
            self.pusher.sync(self.latest)
        self.metrics.set(self.metrics.weight_version, self.state.weight_version)
        self.metrics.set(self.metrics.step, self.state.step)
        # Served last, so the endpoint doubles as readiness: the model is loaded and the group joined.
        if self.settings.metrics_port is not None:
            self._metrics_server = self.metrics.serve(self.settings.metrics_port, self.settings.metrics_host)

    def request_stop(self, *_: object) -> None:
        self._stop = True

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def close(self) -> None:
        try:
            self._wait_publishing()
        except Exception:  # noqa: BLE001 - closing: the version is lost, the next start republishes
            log.exception("the last publish failed")
        self._publisher.shutdown(wait=True)
        if self.broadcaster is not None:
            self.broadcaster.close()
        if hasattr(self, "policy"):
            self.policy.close()  # a group's followers stop with their leader
        self.tracking.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self.http.close()
        self.redis.close()

    def run(self, max_steps: int | None = None, idle_exit_s: float | None = None) -> TrainerState:
        """Train until stopped, until the global step reaches ``max_steps``, or idle for ``idle_exit_s``."""
        idle_since = time.monotonic()
        while not self._stop and (max_steps is None or self.state.step < max_steps):
            # Work not yet durable is flushed after a short idle wait: the aggregator's back-pressure
            # counts our pending entries, so sitting on them would stall the next round.
            dirty = bool(self._uncommitted or self._unpublished)
            entry = self.stream.next(
                min(self.settings.flush_idle_ms, self.settings.block_ms) if dirty else self.settings.block_ms
            )
            if entry is None:
                self._on_idle()
                if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                    break
                continue
            idle_since = time.monotonic()
            self._handle(entry)
        self.flush()
        self._wait_publishing()
        return self.state

    # -- one entry ---------------------------------------------------------------------------------

    def _handle(self, entry: Entry) -> None:
        m = self.metrics
        batch = entry.batch
        outside = None if batch is None else self.policy.tokens_outside_vocab(batch)
        if batch is None or batch.member != self.member or batch.run_id != self.cfg.run_id or outside:
            why = entry.error or outside or f"batch for {batch.member!r}/{batch.run_id!r}"  # type: ignore[union-attr]
            log.error("dropping stream entry %s: %s", entry.entry_id, why)
            self.metrics.labels(m.invalid_dropped).inc()
            self.stream.commit([entry.entry_id], dropped=[f"invalid:{entry.entry_id}"])
            return
        if batch.batch_id in self._applied_set:
            log.info("batch %s already applied: acknowledging without training", batch.batch_id)
            self.metrics.labels(m.duplicates).inc()
            if any(bid == batch.batch_id for _, bid in self._uncommitted):
                self._uncommitted.append((entry.entry_id, None))  # acked with the checkpoint holding its step
            else:
                self.stream.commit([entry.entry_id], applied=[batch.batch_id])
            return
        generated = min(s.weight_version for _, s in batch.samples())
        lag = version_lag(self.state.weight_version, generated, self.renumbering)
        self.metrics.set(m.version_lag, lag)
        if lag > self.cfg.training.max_staleness:
            log.info(
                "dropping batch %s: generated by version %d, trainer at %d (max staleness %d)",
                batch.batch_id,
                generated,
                self.state.weight_version,
                self.cfg.training.max_staleness,
            )
            self.metrics.labels(m.stale_dropped).inc()
            self.stream.commit([entry.entry_id], dropped=[batch.batch_id])
            if self.latest is not None:
                # A replica generating on weights this old has restarted (or missed pushes): bring it
                # to the newest version now rather than at the next idle sync.
                self.pusher.sync(self.latest)
                self._last_sync = time.monotonic()
            return
        stats = self.policy.step(batch)
        self.state.step += 1
        self.state.optimizer_steps += self.cfg.training.steps_per_batch if stats.sequences else 0
        self._remember(batch.batch_id)
        self._uncommitted.append((entry.entry_id, batch.batch_id))
        self._unpublished += 1 if stats.sequences else 0
        self.metrics.record_step(stats, self.state.step)
        if not stats.sequences:
            log.info(
                "step %d batch %s: no signal (all %d groups have equal rewards, mean %.3f): no update",
                self.state.step,
                batch.batch_id,
                stats.groups_skipped,
                stats.mean_reward,
            )
        else:
            log.info(
                "step %d batch %s: loss %.4f reward %.3f kl %.4f clip %.3f %.2fs %.0f tok/s",
                self.state.step,
                batch.batch_id,
                stats.loss,
                stats.mean_reward,
                stats.approx_kl,
                stats.clip_fraction,
                stats.seconds,
                stats.tokens_per_second,
            )
        if self._unpublished >= self.cfg.training.publish_every:
            self.publish()
        values = {**stats.reported(), "weight_version": self.state.weight_version}
        self.tracking.log(Record(f"{self.member}/train", "step", self.state.step, values))
        if len({b for _, b in self._uncommitted if b}) >= self.cfg.training.checkpoint_every:
            self.checkpoint()

    def _remember(self, batch_id: str) -> None:
        if len(self._applied) == self._applied.maxlen:
            self._applied_set.discard(self._applied[0])
        self._applied.append(batch_id)
        self._applied_set.add(batch_id)

    # -- durability (publishing: trainer/publishing.py) ---------------------------------------------------

    def checkpoint(self) -> None:
        """Write a durable checkpoint, then acknowledge every entry whose step it contains."""
        self.state.applied = list(self._applied)
        self.policy.save_checkpoint(self.checkpointer, self.state)
        self.metrics.labels(self.metrics.checkpoints).inc()
        entries = [e for e, _ in self._uncommitted]
        applied = [b for _, b in self._uncommitted if b]
        self.stream.commit(entries, applied=applied, state={"step": self.state.step})
        self._uncommitted.clear()

    def flush(self) -> None:
        if self._unpublished:
            self.publish()
        if self._uncommitted:
            self.checkpoint()

    def _on_idle(self) -> None:
        self.flush()
        self.policy.keepalive()
        now = time.monotonic()
        if now - self._last_claim > self.settings.claim_every_s:
            self.stream.claim_dead(self.settings.claim_idle_ms)
            self._last_claim = now
        publishing = self._publishing is not None and not self._publishing.done()  # it pushes files itself
        if self.latest is not None and not publishing and now - self._last_sync > self.settings.sync_every_s:
            self.pusher.sync(self.latest)  # also catches a replica that restarted
            self._last_sync = now
        try:
            self.metrics.set(self.metrics.backlog, self.stream.backlog())
        except redis.RedisError:
            pass
