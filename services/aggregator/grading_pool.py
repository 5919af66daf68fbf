"""The grading pool: external agents registered over HTTP, in push or pull mode.

- Registration (admin token) returns a grader token; Redis keeps only its sha256.
- Pull: a round puts tasks in the grader's queue with a deadline; ``lease`` hands them out (long
  poll) and records a lease; a lease that expires unanswered before the deadline is re-offered;
  after the deadline a task is dropped. ``submit`` writes each score with ``HSETNX`` keyed by task
  and grader, so duplicates and late results are idempotent no-ops; a task of another grader: 403.
- Push: the round calls the agent's ``/v1/grade`` under its own overall timeout (see judging.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from corl import redis_keys as keys
from corl.proto import GraderRegistered, GraderRegistration, GradingResults, GradingResultsAccepted, GradingTask
from corl.rewards import GraderReliability
from corl.services.errors import ConflictError, ForbiddenError, RateLimitedError, UnauthorizedError

from .metrics import AggregatorMetrics
from .settings import GradingSettings

# Expired leases go back to the queue (atomically, so two polls cannot both re-offer one task).
_REQUEUE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('RPUSH', KEYS[2], id)
end
return #ids
"""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Grader:
    name: str
    mode: str
    url: str | None


class GradingPool:
    def __init__(
        self,
        redis: aioredis.Redis,
        run: str,
        settings: GradingSettings,
        metrics: AggregatorMetrics,
        reliability: GraderReliability,
        reserved: set[str] | None = None,
    ):
        self.redis, self.run, self.settings, self.metrics = redis, run, settings, metrics
        self.reliability = reliability
        self._reserved = reserved or set()  # member names: a member is graded as a peer, not as an agent
        self._requeue = redis.register_script(_REQUEUE)

    # --- registration and auth -----------------------------------------------------------------

    async def register(self, reg: GraderRegistration) -> GraderRegistered:
        if reg.name in self._reserved:
            raise ConflictError(f"{reg.name!r} is a cohort member's name", field="name")
        if await self.redis.hlen(keys.graders(self.run)) >= self.settings.max_graders:
            raise ConflictError(f"the pool is full ({self.settings.max_graders} graders)")
        token = secrets.token_urlsafe(32)
        record = json.dumps({"mode": reg.mode, "url": reg.url, "token_sha256": token_hash(token)})
        if not await self.redis.hsetnx(keys.graders(self.run), reg.name, record):
            raise ConflictError(f"grader {reg.name!r} is already registered", field="name")
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.grader_tokens(self.run), token_hash(token), reg.name)
        pipe.hset(keys.graders_seen(self.run), reg.name, repr(time.time()))
        await pipe.execute()
        self.reliability.register(reg.name, probation=True)
        return GraderRegistered(name=reg.name, mode=reg.mode, token=token, weight=self.reliability.weight(reg.name))

    async def authenticate(self, token: str) -> str:
        """The grader's name for a bearer token; 401 when unknown. Also applies the rate limit."""
        name = await self.redis.hget(keys.grader_tokens(self.run), token_hash(token))
        if name is None:
            raise UnauthorizedError("unknown grader token")
        grader = _text(name)
        now = time.time()
        window = int(now // 60)
        rate_key = keys.grader_rate(self.run, grader, window)
        pipe = self.redis.pipeline(transaction=True)
        pipe.incr(rate_key)
        pipe.expire(rate_key, 120)
        pipe.hset(keys.graders_seen(self.run), grader, repr(time.time()))
        count, _, _ = await pipe.execute()
        if int(count) > self.settings.rate_limit_per_min:
            raise RateLimitedError(
                f"grader {grader!r} exceeded {self.settings.rate_limit_per_min} requests per minute",
                retry_after_s=max(1, int((window + 1) * 60 - now + 0.999)),  # when the next window opens
            )
        return grader

    async def names(self) -> list[str]:
        return sorted(_text(n) for n in await self.redis.hkeys(keys.graders(self.run)))

    async def graders(self) -> list[Grader]:
        """Registered graders: every push grader, and the pull graders that polled recently (a pull
        grader that went away would otherwise hold every round until its deadline)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.graders(self.run))
        pipe.hgetall(keys.graders_seen(self.run))
        raw, seen = await pipe.execute()
        live_after = time.time() - self.settings.pull_active_s
        out = []
        for name, rec in sorted(raw.items()):
            r = json.loads(rec)
            if r["mode"] == "pull" and float(seen.get(name, 0)) < live_after:
                continue
            out.append(Grader(_text(name), r["mode"], r.get("url")))
        return out

    # --- pull mode -----------------------------------------------------------------------------

    async def offer(self, round_: int, grader: str, items: list[tuple[str, str]], deadline: float) -> list[str]:
        """Queue one task per (prompt, response) for ``grader``; returns the task ids. Each offer has ids
        of its own (``r<round>.<attempt>.<grader>.<i>``): a retried round's responses are new, so a score
        given to the failed attempt's task can never be read for them."""
        ttl = max(1, int(deadline - time.time()) + 60)
        attempt = secrets.token_hex(4)
        ids = [f"r{round_}.{attempt}.{grader}.{i}" for i in range(len(items))]
        pipe = self.redis.pipeline(transaction=True)
        for tid, (prompt, response) in zip(ids, items, strict=True):
            k = keys.grading_task(self.run, tid)
            pipe.hset(
                k,
                mapping={
                    "grader": grader,
                    "round": round_,
                    "prompt": prompt,
                    "response": response,
                    "deadline": repr(deadline),
                },
            )
            pipe.expire(k, ttl)
        q = keys.grading_queue(self.run, grader)
        pipe.rpush(q, *ids)
        pipe.expire(q, ttl)
        await pipe.execute()
        return ids

    async def lease(self, grader: str, max_tasks: int, wait_s: float) -> list[GradingTask]:
        max_tasks = max(1, min(max_tasks, self.settings.max_tasks))
        wait_s = max(0.0, min(wait_s, self.settings.max_wait_s))
        q, leases = keys.grading_queue(self.run, grader), keys.grading_leases(self.run, grader)
        end = time.monotonic() + wait_s
        while True:  # bounded by the poll's wait: each pass blocks on the queue until `end`
            await self._requeue(keys=[leases, q], args=[time.time()])
            ids = await self.redis.lpop(q, max_tasks) or []
            if not ids:
                left = end - time.monotonic()
                if left <= 0:
                    return []
                got = await self.redis.blpop([q], timeout=min(left, self.settings.lease_s))
                if got is None:
                    continue
                ids = [got[1], *(await self.redis.lpop(q, max_tasks - 1) or [])]
            tasks = await self._lease_ids(grader, [_text(i) for i in ids])
            if tasks or time.monotonic() >= end:
                return tasks

    async def _lease_ids(self, grader: str, ids: list[str]) -> list[GradingTask]:
        pipe = self.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hgetall(keys.grading_task(self.run, tid))
        now = time.time()
        tasks = []
        for tid, h in zip(ids, await pipe.execute(), strict=True):
            if not h or float(h[b"deadline"]) <= now or b"done" in h:
                continue  # dropped (past its deadline) or already answered
            tasks.append(
                GradingTask(
                    task_id=tid,
                    prompt=h[b"prompt"].decode(),
                    response=h[b"response"].decode(),
                    deadline=float(h[b"deadline"]),
                )
            )
        if tasks:
            expiry = now + self.settings.lease_s
            leases = keys.grading_leases(self.run, grader)
            pipe = self.redis.pipeline(transaction=True)
            pipe.zadd(leases, {t.task_id: min(expiry, t.deadline) for t in tasks})
            pipe.expire(leases, int(self.settings.pull_deadline_s + self.settings.lease_s) + 60)
            await pipe.execute()
        return tasks

    async def submit(self, grader: str, body: GradingResults) -> GradingResultsAccepted:
        pipe = self.redis.pipeline(transaction=False)
        for r in body.results:
            pipe.hmget(keys.grading_task(self.run, r.task_id), ["grader", "round", "deadline"])
        metas = await pipe.execute()
        now = time.time()
        for r, (owner, _, _) in zip(body.results, metas, strict=True):
            if owner is not None and owner.decode() != grader:
                raise ForbiddenError(f"task {r.task_id} is not leased to grader {grader!r}", field="results.task_id")
        pipe = self.redis.pipeline(transaction=True)
        writes, late = [], 0
        for r, (owner, round_, deadline) in zip(body.results, metas, strict=True):
            if owner is None or float(deadline) < now:
                late += 1
                continue
            rk = keys.grading_results(self.run, int(round_))
            pipe.hsetnx(rk, f"{r.task_id}:{grader}", repr(r.score))
            pipe.expire(rk, int(self.settings.pull_deadline_s) + 3600)
            pipe.zrem(keys.grading_leases(self.run, grader), r.task_id)
            pipe.hset(keys.grading_task(self.run, r.task_id), "done", 1)
            writes.append(r)
        replies = await pipe.execute() if writes else []
        accepted = sum(int(x) for x in replies[0::4])
        dupes = len(writes) - accepted
        self.metrics.grading_results.labels("accepted").inc(accepted)
        self.metrics.grading_results.labels("duplicate").inc(dupes)
        self.metrics.grading_results.labels("late").inc(late)
        return GradingResultsAccepted(accepted=accepted, ignored=dupes + late)

    async def collect(self, round_: int, tasks: dict[str, str], deadline: float) -> dict[str, float]:
        """Wait (until ``deadline``) for scores of ``tasks`` (task id -> grader); returns those in."""
        rk = keys.grading_results(self.run, round_)
        fields = [f"{tid}:{g}" for tid, g in tasks.items()]
        got: dict[str, float] = {}
        while fields:
            values = await self.redis.hmget(rk, fields)
            for f, v in zip(fields, values, strict=True):
                if v is not None:
                    got[f.rsplit(":", 1)[0]] = float(v)
            fields = [f for f, v in zip(fields, values, strict=True) if v is None]
            left = deadline - time.time()
            if not fields or left <= 0:
                break
            await asyncio.sleep(min(0.1, left))
        return got
