"""Harvesting off the request path: a bounded queue and the workers that write the run's prompt pool.

On the request path only ``offer`` runs: the policy's opt-in and sampling (``corl.harvest.policy``)
and a ``put_nowait``. A full queue drops the prompt there and then (counted), never the request. The
workers read the conversation out of the body, apply the size bound, redact it (in a worker thread:
the hook is the operator's code) and write it with one Lua call that de-duplicates, appends to the
pool stream (trimmed to ``max_prompts`` and to its retention: exact bounds, each write removes at most
the few entries past them) and counts, all at once. A write that fails or passes ``redis_timeout_s``
drops the prompt (``pool_down``); drop counts that could not be written are written with the next
write that succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from .metrics import GatewayMetrics
from .settings import GatewaySettings

log = logging.getLogger(__name__)

# KEYS: seen marker, pool stream, stats hash. ARGV: dedupe (0/1), seen TTL s, MAXLEN, MINID, entry JSON,
# redacted (0/1), then reason/count pairs of drops to add.
_STORE = """
for i = 7, #ARGV, 2 do redis.call('HINCRBY', KEYS[3], 'dropped:' .. ARGV[i], ARGV[i + 1]) end
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
        self._store = redis.register_script(_STORE)
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
            t.cancel()
        for t in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._workers = []

    async def _work(self) -> None:
        while True:
            offer = await self.queue.get()
            self.metrics.queue_depth.set(self.queue.qsize())
            try:
                if not await self.store(offer) and self._unwritten:
                    await self._flush()
            except Exception:  # never fatal: one prompt lost, the worker goes on
                log.exception("harvest worker: a prompt was lost")
                self._drop("pool_down")
            finally:
                self.queue.task_done()

    async def _flush(self) -> None:
        """Count the drops Redis has not counted yet (kept for the next try when it does not answer)."""
        pending = list(self._unwritten.items())
        self._unwritten.clear()
        pipe = self.redis.pipeline(transaction=False)
        for reason, n in pending:
            pipe.hincrby(keys.harvest_stats(self.run), f"dropped:{reason}", n)
        try:
            async with asyncio.timeout(self.settings.redis_timeout_s):
                await pipe.execute()
        except (RedisError, TimeoutError, OSError):
            self._unwritten.update(dict(pending))

    def _drop(self, reason: DropReason) -> None:
        self.metrics.dropped.labels(reason).inc()
        self._unwritten[reason] += 1

    async def store(self, offer: Offer) -> bool:
        """Write one offered request to the pool; True when it was stored."""
        conv = conversation_of(offer.route, offer.body)
        if conv is None:
            self._drop("unreadable")
            return False
        if too_large(self.policy, conv):
            self._drop("too_large")
            return False
        try:
            conv, redactions = await asyncio.to_thread(self.redactor, conv)
        except RedactionFailed as err:
            log.warning("harvest: %s; the conversation was not stored", err)
            self._drop("redaction_failed")
            return False
        sha = digest(conv)
        entry = HarvestedPrompt(
            id=sha[:16], conversation=conv, member=offer.member, route=offer.route, at=offer.at, redactions=redactions
        )
        min_id = f"{max(0, int((time.time() - self.policy.retention_s) * 1000))}-0"
        pending = list(self._unwritten.items())
        self._unwritten.clear()
        args: list[str | int] = [
            int(self.policy.dedupe),
            max(1, int(self.policy.retention_s)),
            self.policy.max_prompts,
            min_id,
            entry.model_dump_json(),
            int(redactions > 0),
        ]
        for reason, n in pending:
            args += [reason, n]
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.settings.redis_timeout_s):
                added = await self._store(
                    keys=[keys.harvest_seen(self.run, sha), keys.harvest_pool(self.run), keys.harvest_stats(self.run)],
                    args=args,
                )
        except (RedisError, TimeoutError, OSError) as err:
            self._unwritten.update(dict(pending))
            log.warning("harvest: the pool did not take a prompt (%s): dropped", type(err).__name__)
            self._drop("pool_down")
            return False
        self.metrics.pool_write_seconds.observe(time.perf_counter() - t0)
        if not added:
            self.metrics.dropped.labels("duplicate").inc()
            return False
        self.metrics.harvested.inc()
        if redactions:
            self.metrics.redacted.inc()
        return True

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
