"""The evaluator's loop, in one worker thread: poll each served member's weight version, read its held-out
accuracy when due (``corl.heldout.is_due``: at start, then every ``eval_every`` versions), and publish the
reading to Redis (the aggregator's stats and dashboard), Prometheus and the experiment trackers.

Nothing that goes wrong with a member stops the loop: a server that is down, a failed reading or a
refused Redis write is logged, counted (``corl_evaluator_failures_total{stage}``) and tried again at the
next poll. Readings are blocking I/O and answer checking (math-verify, sandboxed programs), so they run in
the thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import httpx
import redis

from corl import redis_keys
from corl.config import CohortConfig, MemberConfig
from corl.heldout import HeldoutReader, is_due, read_readings, tracking_record, write_reading
from corl.proto import HeldoutAccuracy, HeldoutReadings
from corl.services.errors import NotFoundError
from corl.tracking import Tracking

from .metrics import EvaluatorMetrics
from .settings import EvaluatorSettings

log = logging.getLogger(__name__)


class Stopping(Exception):
    """The service is shutting down: a reading in progress stops after its current request."""


class EvaluatorServing:
    def __init__(
        self,
        cfg: CohortConfig,
        settings: EvaluatorSettings,
        reader: HeldoutReader,
        redis_client: redis.Redis,
        metrics: EvaluatorMetrics,
        tracking: Tracking | None = None,
    ) -> None:
        self.cfg, self.settings, self.reader, self.metrics = cfg, settings, reader, metrics
        self.redis = redis_client
        self.tracking = tracking or Tracking()
        # Outside endpoint members have no weights of corl's to follow: only members corl serves are read.
        self.members: list[MemberConfig] = cfg.served_members()
        self.readings: dict[str, HeldoutAccuracy] = {}
        self._unwritten: set[str] = set()  # readings Redis has not taken yet
        self._restored = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def start(self, poll: bool) -> None:
        if poll:
            self._thread = threading.Thread(target=self._run, name="corl-evaluator", daemon=True)
            self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.settings.stop_timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # never fatal: the next poll tries again
                log.exception("run %s: held-out poll failed", self.cfg.run_id)
            self._stop.wait(self.settings.poll_s)

    def poll(self) -> list[str]:
        """One pass over the served members; returns those read this time."""
        self._restore()
        read = []
        for m in self.members:
            if self._stop.is_set():
                break
            if self._poll_member(m):
                read.append(m.name)
            self._write(m.name)
        return read

    def view(self, run: str) -> HeldoutReadings:
        if run != self.cfg.run_id:
            raise NotFoundError(f"no run {run!r}; this evaluator reads {self.cfg.run_id!r}")
        return HeldoutReadings(
            run_id=run,
            eval_every=self.settings.eval_every,
            eval_prompts=len(self.reader.examples),
            members=dict(self.readings),
        )

    def _restore(self) -> None:
        """Once: the readings this run's hash already holds (an earlier evaluator's, before a restart), so
        what was read is not read again until it is due."""
        if self._restored:
            return
        try:
            raw = self.redis.hgetall(redis_keys.heldout_accuracy(self.cfg.run_id))
        except redis.RedisError as err:
            log.warning("run %s: earlier held-out readings not read (next poll retries): %s", self.cfg.run_id, err)
            return
        self._restored = True
        served = {m.name for m in self.members}
        for name, reading in read_readings(raw).items():  # type: ignore[arg-type]
            if name in served and name not in self.readings:
                self.readings[name] = reading
                self.metrics.observe(name, reading)

    def _poll_member(self, member: MemberConfig) -> bool:
        last = self.readings.get(member.name)
        try:
            version = self.reader.served_version(member, self.settings.info_timeout_s)
        except (httpx.HTTPError, ValueError) as err:
            self.metrics.failures.labels(member.name, "version").inc()
            log.warning("%s: weight version not read: %s", member.name, err)
            return False
        if not is_due(last.weight_version if last else None, version, self.settings.eval_every):
            return False
        t0 = time.monotonic()
        try:
            reading = self.reader.evaluate(member, advance=self._stopping)
        except Stopping:
            return False
        except (httpx.HTTPError, ValueError) as err:
            self.metrics.failures.labels(member.name, "evaluate").inc()
            log.warning("%s: held-out reading at version %d failed (next poll retries): %s", member.name, version, err)
            return False
        self.metrics.duration.labels(member.name).observe(time.monotonic() - t0)
        self.readings[member.name] = reading
        self.metrics.observe(member.name, reading)
        self.tracking.log(tracking_record(member.name, reading))
        self._unwritten.add(member.name)
        log.info(
            "%s: held-out accuracy %.3f at weight version %d (%d problems, %.1fs)",
            member.name,
            reading.accuracy,
            reading.weight_version,
            len(self.reader.examples),
            time.monotonic() - t0,
        )
        return True

    def _write(self, member: str) -> None:
        if member not in self._unwritten:
            return
        try:
            write_reading(
                self.redis, self.cfg.run_id, member, self.readings[member], attempts=self.settings.record_attempts
            )
        except redis.RedisError as err:
            self.metrics.failures.labels(member, "record").inc()
            log.warning("%s: held-out reading not recorded in Redis (next poll retries): %s", member, err)
            return
        self._unwritten.discard(member)

    def _stopping(self, _: int) -> None:
        if self._stop.is_set():
            raise Stopping
