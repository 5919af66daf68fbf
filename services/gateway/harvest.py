"""Harvesting off the request path: a bounded queue and the workers that write the run's prompt pool.

On the request path only ``offer`` runs: the policy's opt-in and sampling (``corl.harvest.policy``)
and a ``put_nowait``. A full queue drops the prompt there and then (counted), never the request. A
worker waits ``harvest_linger_ms`` after the first queued prompt (requests close behind it are answered
before the write takes the event loop), takes what is queued (up to ``harvest_batch``), reads each
conversation out of its body, applies the size bound, redacts it (a hook, the operator's code, in a
worker thread) and writes the batch in one pipelined round trip: per conversation one Lua call that
de-duplicates, appends to the pool stream (trimmed to ``max_prompts`` and to its retention: exact
bounds, each write removes at most the few entries past them) and counts, all at once. A write that
fails or passes ``redis_timeout_s`` drops the prompt (``pool_down``); drop counts that could not be
written are written with the next write that succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from corl import redis_keys as keys
from corl.config import CohortConfig
from corl.harvest import RedactionFailed, Redactor, conversation_of, digest, opted_in, sampled, too_large
from corl.harvest.stats import read_stats
from corl.proto.gateway import DropReason, HarvestedPrompt, HarvestRoute, HarvestStats
from corl.services.background import stop_task

from .metrics import GatewayMetrics
from .settings import GatewaySettings

log = logging.getLogger(__name__)

# KEYS: seen marker, pool stream, stats hash. ARGV: dedupe (0/1), seen TTL s, MAXLEN, MINID, entry JSON,
# redacted (0/1).
_STORE = """
if ARGV[1] == '1' and not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
  redis.call('HINCRBY', KEYS[3], 'dropped:duplicate', 1)
  return 0
end
redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[3], '*', 'prompt', ARGV[5])
redis.call('XTRIM', KEYS[2], 'MINID', ARGV[4])
redis.call('HINCRBY', KEYS[3], 'harvested', 1)
if ARGV[6] == '1' then redis.call('HINCRBY', KEYS[3], 'redacted', 1) end
return 1
"""


@dataclass(frozen=True)
class Offer:
    route: HarvestRoute
    member: str
    body: bytes
    at: float


class Harvester:
    def __init__(
        self,
        cfg: CohortConfig,
        settings: GatewaySettings,
        redis: aioredis.Redis,
        metrics: GatewayMetrics,
        redactor: Redactor,
        rng: random.Random | None = None,
    ) -> None:
        self.run, self.policy, self.settings = cfg.run_id, cfg.gateway.harvest, settings
        self.redis, self.metrics, self.redactor = redis, metrics, redactor
        self.rng = rng or random.Random()
        self.queue: asyncio.Queue[Offer] = asyncio.Queue(maxsize=settings.harvest_queue)
        self._unwritten: Counter[str] = Counter()  # drops not yet counted in Redis
        self._workers: list[asyncio.Task[None]] = []

    # --- the request path ---------------------------------------------------------------------------

    def offer(self, route: HarvestRoute, member: str, body: bytes) -> None:
        """Queue the request for harvesting when the policy opts it in and samples it; never blocks."""
        if not opted_in(self.policy, route, member) or not sampled(self.policy, self.rng):
            return
        try:
            self.queue.put_nowait(Offer(route, member, body, time.time()))
        except asyncio.QueueFull:
            self._drop("queue_full")
        self.metrics.queue_depth.set(self.queue.qsize())

    # --- the workers --------------------------------------------------------------------------------

    def start(self) -> None:
        self._workers = [
            asyncio.create_task(self._work(), name=f"corl-harvest-{i}") for i in range(self.settings.harvest_workers)
        ]

    async def stop(self) -> None:
        for t in self._workers:
            await stop_task(t)
        self._workers = []

    async def _work(self) -> None:
        while True:
            batch = [await self.queue.get()]
            try:
                # The requests right behind this one go first (the write's CPU is the event loop's too).
                await asyncio.sleep(self.settings.harvest_linger_ms / 1000)
                while len(batch) < self.settings.harvest_batch and not self.queue.empty():
                    batch.append(self.queue.get_nowait())  # under load, one round trip writes many
                self.metrics.queue_depth.set(self.queue.qsize())
                await self.store(batch)
            except Exception:  # never fatal: these prompts are lost, the worker goes on
                log.exception("harvest worker: %d prompts were lost", len(batch))
                for _ in batch:
                    self._drop("pool_down")
            finally:
                for _ in batch:
                    self.queue.task_done()

    def _drop(self, reason: DropReason) -> None:
        self.metrics.dropped.labels(reason).inc()
        self._unwritten[reason] += 1

    async def _entry(self, offer: Offer) -> tuple[HarvestedPrompt, str] | None:
        """The pool entry of an offered request (read, bounded, redacted) and its digest; None: dropped."""
        conv = conversation_of(offer.route, offer.body)
        if conv is None:
            self._drop("unreadable")
            return None
        if too_large(self.policy, conv):
            self._drop("too_large")
            return None
        try:
            # Patterns alone take microseconds; a hook is the operator's code, which may block: a thread.
            if self.redactor.hook is None:
                conv, redactions = self.redactor(conv)
            else:
                conv, redactions = await asyncio.to_thread(self.redactor, conv)
        except RedactionFailed as err:
            log.warning("harvest: %s; the conversation was not stored", err)
            self._drop("redaction_failed")
            return None
        sha = digest(conv)
        entry = HarvestedPrompt(
            id=sha[:16], conversation=conv, member=offer.member, route=offer.route, at=offer.at, redactions=redactions
        )
        return entry, sha

    async def store(self, offers: list[Offer]) -> int:
        """Write offered requests to the pool in one round trip; returns how many were stored. The drop
        counts Redis has not taken yet go with it (and stay pending when it fails)."""
        entries = [e for e in [await self._entry(o) for o in offers] if e is not None]
        pending = list(self._unwritten.items())
        self._unwritten.clear()
        if not entries and not pending:
            return 0
        min_id = f"{max(0, int((time.time() - self.policy.retention_s) * 1000))}-0"
        pipe = self.redis.pipeline(transaction=False)
        for reason, n in pending:
            pipe.hincrby(keys.harvest_stats(self.run), f"dropped:{reason}", n)
        for entry, sha in entries:
            args: list[str | int] = [int(self.policy.dedupe), max(1, int(self.policy.retention_s))]
            args += [self.policy.max_prompts, min_id, entry.model_dump_json(), int(entry.redactions > 0)]
            ks = [keys.harvest_seen(self.run, sha), keys.harvest_pool(self.run), keys.harvest_stats(self.run)]
            pipe.eval(_STORE, len(ks), *ks, *args)  # EVAL: no SCRIPT EXISTS round trip, and a restarted Redis is fine
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.settings.redis_timeout_s):
                replies = await pipe.execute()
        except (RedisError, TimeoutError, OSError) as err:
            self._unwritten.update(dict(pending))
            log.warning("harvest: the pool did not take %d prompts (%s): dropped", len(entries), type(err).__name__)
            for _ in entries:
                self._drop("pool_down")
            return 0
        self.metrics.pool_write_seconds.observe(time.perf_counter() - t0)
        added = replies[len(pending) :]
        for (entry, _), ok in zip(entries, added, strict=True):
            if not ok:
                self.metrics.dropped.labels("duplicate").inc()
                continue
            self.metrics.harvested.inc()
            if entry.redactions:
                self.metrics.redacted.inc()
        return sum(1 for ok in added if ok)

    async def drain(self) -> None:
        """Wait until every queued prompt is written or dropped (tests, shutdown)."""
        await self.queue.join()


async def harvest_stats(redis: aioredis.Redis, run: str) -> HarvestStats:
    """The run-wide counters and the pool's size, as Redis holds them."""
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(keys.harvest_stats(run))
    pipe.xlen(keys.harvest_pool(run))
    raw, size = await pipe.execute()
    return read_stats(raw, int(size))
