"""How a trainer publishes a weight version (mixed into ``Trainer``, ``trainer/loop.py``): by broadcast
to the member's weight group, its snapshot taken beside the next step and its files written after, or
by files alone (written, checksummed, pushed, all in the step). One version is in flight at a time."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import redis
import torch

from .batches import BatchStream
from .broadcast import WeightBroadcaster
from .checkpoint import TrainerState
from .group import GroupLeader
from .metrics import TrainerMetrics
from .policy import PolicyTrainer
from .publish import Published, ReplicaPusher, WeightsStore

log = logging.getLogger(__name__)


class Publishing:
    """The publishing half of ``Trainer``: what it uses of the trainer is declared here."""

    member: str
    stream: BatchStream
    store: WeightsStore
    pusher: ReplicaPusher
    broadcaster: WeightBroadcaster | None
    policy: PolicyTrainer | GroupLeader
    metrics: TrainerMetrics
    state: TrainerState
    latest: Published | None
    _publisher: ThreadPoolExecutor
    _publishing: Future[None] | None
    _snapshot: dict[str, torch.Tensor] | None
    _transfer_shown: str | None
    _unpublished: int

    def publish(self) -> None:
        """A new version of the weights: by broadcast where the member's weight group is (or can be) up,
        else by files. Waits for the previous version's broadcast and files first (one in flight).

        By broadcast, one process takes the snapshot beside the next step (the publisher thread reads
        the weights while the step's forward and backward passes do; its optimizer step waits for the
        snapshot, ``PolicyTrainer.before_update``); a trainer group takes it here, a collective every
        rank makes in step."""
        self._wait_publishing()
        b = self.broadcaster
        if b is not None and b.wants_join():
            b.join()
        if b is None or b.group is None or b.dtype is None:
            self._show_transfer("files")
            t0 = time.perf_counter()
            self._publish_files()
            self.metrics.labels(self.metrics.publish_stall_seconds).observe(time.perf_counter() - t0)
            return
        self._show_transfer("broadcast")
        version = self._next_version()
        self.stream.announce_version(version)
        self.state.weight_version = version
        self._unpublished = 0
        if isinstance(self.policy, PolicyTrainer):
            taken = threading.Event()
            self.policy.before_update = partial(self._await_snapshot, taken)
            self._publishing = self._publisher.submit(self._snapshot_beside_step, version, taken)
            return
        t0 = time.perf_counter()
        snapshot = self._take_snapshot()
        self.metrics.labels(self.metrics.publish_stall_seconds).observe(time.perf_counter() - t0)
        self._publishing = self._publisher.submit(self._publish_broadcast, version, snapshot)

    def _take_snapshot(self) -> dict[str, torch.Tensor]:
        """The weights in the servers' dtype, into a free shared-memory segment where there is one."""
        b = self.broadcaster
        assert b is not None and b.dtype is not None
        snapshot = self.policy.weights_snapshot(b.dtype, b.staging(self._snapshot))
        assert snapshot is not None  # this is the leader
        self._snapshot = snapshot
        return snapshot

    def _snapshot_beside_step(self, version: int, taken: threading.Event) -> None:
        try:
            snapshot = self._take_snapshot()
        finally:
            taken.set()  # the step may change the weights now (if the snapshot failed, so does the publish)
        self._publish_broadcast(version, snapshot)

    def _await_snapshot(self, taken: threading.Event) -> None:
        """Before the optimizer step after a publish: what the snapshot still holds the step up."""
        t0 = time.perf_counter()
        taken.wait()
        self.metrics.labels(self.metrics.publish_stall_seconds).observe(time.perf_counter() - t0)

    def _next_version(self) -> int:
        stream = self.stream
        return max(self.state.weight_version, self.store.latest_version(), stream.published_version(),
                   stream.announced_version()) + 1  # fmt: skip

    def _publish_files(self) -> None:
        version = self._next_version()
        pub = self.policy.save_weights(self.store, version)
        assert pub is not None  # written here (a group's leader is the one rank that writes)
        self.state.weight_version = version
        self._unpublished = 0
        self._published(pub)
        outcomes = self.pusher.push(pub)
        failed = sum(o in ("unreachable", "rejected") for o in outcomes.values())
        if failed:
            self.metrics.labels(self.metrics.push_failures).inc(failed)
        log.info("published %s version %d (%s): %s", self.member, version, pub.sha256[:12], outcomes)

    def _publish_broadcast(self, version: int, snapshot: dict[str, torch.Tensor]) -> None:
        """In the background: broadcast, then the files from the same snapshot, then those files to every
        replica the broadcast did not reach (outside the group, or failed: each serves its previous version)."""
        assert self.broadcaster is not None
        try:
            broadcast = self.broadcaster.send(version, snapshot, str(self.store.path(version)))
        except Exception:  # noqa: BLE001 - the files still go out: every replica gets the version from them
            log.exception("%s: broadcast of version %d failed", self.member, version)
            self.broadcaster.close_group()
            broadcast = {}
        pub = self.policy.save_snapshot(self.store, version, snapshot)
        self._published(pub)
        by_files = {
            url: self.pusher.push_one(url, pub, attempts=1 if url in self.pusher.behind else None)
            for url in self.pusher.servers
            if broadcast.get(url) != "ok"
        }
        for url, outcome in broadcast.items():
            if outcome == "ok":
                self.pusher.behind.discard(url)
        failed = sum(o in ("unreachable", "rejected") for o in by_files.values())
        if failed:
            self.metrics.labels(self.metrics.push_failures).inc(failed)
        got = sorted(u for u, o in broadcast.items() if o == "ok")
        log.info("published %s version %d (%s): broadcast to %s, files %s", self.member, version, pub.sha256[:12],
                 got, by_files)  # fmt: skip

    def _published(self, pub: Published) -> None:
        """``pub``'s files exist: it counts as published."""
        self.stream.record_version(pub.version)
        self.latest = pub
        self.metrics.labels(self.metrics.publishes).inc()
        self.metrics.set(self.metrics.weight_version, pub.version)

    def _wait_publishing(self) -> None:
        """The version in flight is broadcast and its files written (its errors raise here)."""
        job, self._publishing = self._publishing, None
        if job is not None:
            job.result()

    def _show_transfer(self, transfer: str) -> None:
        """Record how versions go now (the run's stats and dashboard read it), when it changes."""
        if transfer != self._transfer_shown:
            self._transfer_shown = transfer
            try:
                self.stream.record_transfer(transfer)
            except redis.RedisError:
                self._transfer_shown = None
