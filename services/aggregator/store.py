"""The aggregator's Redis state: batch streams, the round record, back-pressure, per-round stats.

A round's writes go in ONE Lua script call, so they are atomic and cost one round trip: it checks
that the round is still the next one (a stale or restarted aggregator cannot write it twice), sets
a marker per batch id (``SET NX``) and only then ``XADD``s the batch (``MAXLEN ~``), appends the
round's stats and advances the round counter, prompt cursor and learnt state together.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from corl import redis_keys as keys
from corl.streams import as_str, find_group

from .batches import batch_id

log = logging.getLogger(__name__)

_COMMIT = """
local nr = tonumber(redis.call('HGET', KEYS[1], 'next_round') or '0')
if nr ~= tonumber(ARGV[1]) then return -1 end
local added = 0
local nb = (#KEYS - 2) / 2
for i = 1, nb do
  if redis.call('SET', KEYS[1 + 2 * i], '1', 'NX', 'EX', ARGV[4]) then
    redis.call('XADD', KEYS[2 + 2 * i], 'MAXLEN', '~', ARGV[3], '*', 'batch', ARGV[7 + i])
    added = added + 1
  end
end
redis.call('HSET', KEYS[1], 'next_round', nr + 1, 'cursor', ARGV[2], 'learnt', ARGV[5])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', 'stats', ARGV[6])
return added
"""


@dataclass
class RoundState:
    next_round: int = 0
    cursor: int = 0
    learnt: dict[str, Any] = field(default_factory=dict)  # reliability + collapse detector snapshots


class RoundStore:
    def __init__(self, redis: aioredis.Redis, run: str, *, stream_maxlen: int, stats_maxlen: int, marker_ttl_s: int):
        self.redis, self.run = redis, run
        self._state = keys.round_state(run)
        self._stats = keys.round_stats(run)
        self._maxlen, self._stats_maxlen, self._ttl = stream_maxlen, stats_maxlen, marker_ttl_s
        self._commit = redis.register_script(_COMMIT)

    async def ensure_groups(self, members: list[str]) -> None:
        """One ``trainer`` consumer group per member stream, reading from the start."""
        for m in members:
            try:
                await self.redis.xgroup_create(
                    keys.batches_stream(self.run, m), keys.TRAINER_GROUP, id="0", mkstream=True
                )
            except ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise

    async def load(self) -> RoundState:
        raw = await self.redis.hgetall(self._state)
        if not raw:
            return RoundState()
        return RoundState(
            next_round=int(raw.get(b"next_round", 0)),
            cursor=int(raw.get(b"cursor", 0)),
            learnt=json.loads(raw[b"learnt"]) if raw.get(b"learnt") else {},
        )

    async def unconsumed(self, members: list[str], limit: int = 64) -> dict[str, int]:
        """Batches per member stream not yet delivered to its trainer (capped at ``limit``).

        Delivered-but-unacknowledged entries do not count: a trainer reads one batch when it is
        ready to train it and acknowledges only once its checkpoint is durable, so counting those
        would make generation wait on checkpoints. Counted from the group's last-delivered id with
        XRANGE, which works on every Redis with streams (XINFO's ``lag`` needs Redis 7).
        """
        pipe = self.redis.pipeline(transaction=False)
        for m in members:
            pipe.xinfo_groups(keys.batches_stream(self.run, m))
        replies = await pipe.execute(raise_on_error=False)
        last: dict[str, str] = {}
        for m, groups in zip(members, replies, strict=True):
            if isinstance(groups, Exception):
                continue  # stream gone: ensure_groups recreates it on the next start
            g = find_group(groups, keys.TRAINER_GROUP)
            if g is not None:
                last[m] = as_str(g["last-delivered-id"])
        pipe = self.redis.pipeline(transaction=False)
        for m in last:
            pipe.xrange(keys.batches_stream(self.run, m), min=f"({last[m]}", count=limit)
        counts = await pipe.execute() if last else []
        out = dict.fromkeys(members, 0)
        out.update({m: len(entries) for m, entries in zip(last, counts, strict=True)})
        return out

    async def commit(
        self, round_: int, cursor: int, batches: dict[str, bytes], stats_json: str, learnt: dict[str, Any]
    ) -> int:
        """Atomically append ``batches`` (member -> GradedBatch JSON) and advance the round.

        Returns how many batches were added (those already written before are skipped), or -1
        when ``round_`` is no longer the next round (another aggregator committed it).
        """
        ks = [self._state, self._stats]
        args: list[Any] = [round_, cursor, self._maxlen, self._ttl, json.dumps(learnt), stats_json, self._stats_maxlen]
        for member, body in batches.items():
            ks += [
                keys.batch_marker(self.run, batch_id(self.run, round_, member)),
                keys.batches_stream(self.run, member),
            ]
            args.append(body)
        return int(await self._commit(keys=ks, args=args))

    async def count_trained(self, n: int) -> None:
        """Count ``n`` harvested prompts as trained on (after their round's commit; a count only: a failure
        is logged, never the round's)."""
        try:
            await self.redis.hincrby(keys.harvest_stats(self.run), "trained_on", n)
        except RedisError as err:
            log.warning("harvest counter not updated: %s", type(err).__name__)

    async def harvest(self) -> tuple[dict[bytes, bytes], int]:
        """The run's harvest counters (raw hash) and the pool's length."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.harvest_stats(self.run))
        pipe.xlen(keys.harvest_pool(self.run))
        raw, size = await pipe.execute()
        return dict(raw), int(size)

    async def recent_stats(self, n: int) -> list[str]:
        entries: Any = await self.redis.xrevrange(self._stats, count=n)
        return [fields[b"stats"].decode() for _, fields in reversed(entries)]

    async def weight_transfers(self, members: list[str]) -> dict[str, str]:
        """How each trained member's versions reach its servers, as its trainer last recorded it."""
        pipe = self.redis.pipeline(transaction=False)
        for m in members:
            pipe.hget(keys.trainer_state(self.run, m), "weight_transfer")
        got = await pipe.execute()
        return {m: as_str(v) for m, v in zip(members, got, strict=True) if v is not None}

    async def heldout(self) -> dict[bytes, bytes]:
        """The evaluator's latest held-out reading per member (raw hash: ``corl.heldout.read_readings``)."""
        raw: Any = await self.redis.hgetall(keys.heldout_accuracy(self.run))
        return dict(raw)
