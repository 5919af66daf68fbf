"""Each tracker behind its own bounded queue and daemon thread, and the fan-out a process logs to.

Reporting never stops or slows training: ``Tracking.log`` only puts records on queues (a full queue
drops the record and counts it). A tracker's thread opens it lazily and delivers batches; a call that
fails is counted in ``corl_tracking_errors_total``, logged once per tracker, and the tracker is paused
with exponential back-off (records wait in its queue meanwhile), then tried again, for as long as the
process runs. No exception of a tracker ever reaches the caller.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Literal, Protocol

from .metrics import TrackingMetrics
from .records import Record

log = logging.getLogger(__name__)

BATCH = 500  # records one call delivers at most

Outcome = Literal["finished", "failed", "killed"]  # how the process's work ended, for trackers that keep it


class Tracker(Protocol):
    """One tool's client. ``open`` and ``log`` may raise; they run on the tracker's own thread."""

    name: str

    def open(self) -> None: ...

    def log(self, records: Sequence[Record]) -> None: ...

    def close(self, outcome: Outcome) -> None: ...


class TrackerWorker:
    def __init__(
        self,
        tracker: Tracker,
        metrics: TrackingMetrics,
        queue_size: int,
        backoff_s: tuple[float, float] = (1.0, 60.0),
    ) -> None:
        self.tracker, self.name = tracker, tracker.name
        self._records, self._errors, self._dropped = (
            m.labels(tracker.name) for m in (metrics.records, metrics.errors, metrics.dropped)
        )
        self._queue: queue.Queue[Record] = queue.Queue(queue_size)
        self._stop = threading.Event()
        self._backoff_s = backoff_s
        self._opened = self._warned = False
        self._outcome: Outcome = "finished"
        self.failures = 0  # consecutive failed calls
        self.errors = 0  # failed calls in all
        self._thread = threading.Thread(target=self._run, name=f"corl-tracking-{tracker.name}", daemon=True)
        self._thread.start()

    def put(self, record: Record) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._dropped.inc()

    def stop(self, outcome: Outcome = "finished") -> None:
        """Deliver what is queued (unless the tracker is failing), close the tracker, end the thread."""
        self._outcome = outcome
        self._stop.set()

    def join(self, timeout_s: float) -> bool:
        self._thread.join(max(0.0, timeout_s))
        return not self._thread.is_alive()

    # -- the tracker's thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            batch = self._take()
            if not batch:
                continue
            if self._stop.is_set() and self.failures:
                self._dropped.inc(len(batch) + self._queue.qsize())  # failing at exit: give up, do not wait
                break
            self._deliver(batch)
        self._close()

    def _take(self) -> list[Record]:
        try:
            batch = [self._queue.get(timeout=0.2)]
        except queue.Empty:
            return []
        while len(batch) < BATCH:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _deliver(self, batch: list[Record]) -> None:
        try:
            if not self._opened:
                self.tracker.open()
                self._opened = True
            self.tracker.log(batch)
        except Exception as err:  # any failure of a tracker stays here
            self._failed(err, len(batch))
            return
        if self.failures:
            log.info("%s tracking works again after %d failed calls", self.name, self.failures)
        self.failures = 0
        self._records.inc(len(batch))

    def _failed(self, err: Exception, records: int) -> None:
        self.failures += 1
        self.errors += 1
        self._errors.inc()
        self._dropped.inc(records)
        if not self._warned:
            self._warned = True
            log.warning(
                "%s tracking failed (%s: %s); the run goes on without it, retried with back-off, failures counted "
                "in corl_tracking_errors_total",
                self.name,
                type(err).__name__,
                str(err)[:300],
            )
        log.debug("%s tracking failed", self.name, exc_info=err)
        first, cap = self._backoff_s
        self._stop.wait(min(cap, first * 2 ** (self.failures - 1)))

    def _close(self) -> None:
        if not self._opened:
            return
        try:
            self.tracker.close(self._outcome)
        except Exception as err:
            self._errors.inc()
            log.warning("%s tracking did not close cleanly: %s", self.name, err)


class Tracking:
    """What a process logs to: every configured tracker, each on its own worker (none: does nothing)."""

    def __init__(self, workers: Sequence[TrackerWorker] = (), close_timeout_s: float = 10.0) -> None:
        self.workers = list(workers)
        self.close_timeout_s = close_timeout_s

    @property
    def enabled(self) -> bool:
        return bool(self.workers)

    def log(self, *records: Record) -> None:
        for w in self.workers:
            for r in records:
                w.put(r)

    def errors(self) -> dict[str, int]:
        """Failed calls so far, per tracker that had any."""
        return {w.name: w.errors for w in self.workers if w.errors}

    def close(self, outcome: Outcome = "finished") -> None:
        """Flush and close every tracker, waiting ``close_timeout_s`` at most in all (a tracker still
        busy then is left to its daemon thread and ends with the process)."""
        for w in self.workers:
            w.stop(outcome)
        deadline = time.monotonic() + self.close_timeout_s
        for w in self.workers:
            if not w.join(deadline - time.monotonic()):
                log.warning("%s tracking still flushing after %.0fs: left behind", w.name, self.close_timeout_s)
