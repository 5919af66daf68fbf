"""The member's graded-batch stream, read through the ``trainer`` consumer group.

Delivery is at-least-once: an entry stays pending until ``commit`` acknowledges it, which the loop
does only after the step that used it is in a durable checkpoint; acknowledged, it is deleted in the
same transaction (nothing a trainer could still need), unless the trainer keeps them (``keep_acked``).
On start (and periodically) the consumer takes over entries another consumer of the group left
pending (``XAUTOCLAIM``) and re-reads its own pending entries before new ones. Duplicate
suppression is by batch id, in the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import ValidationError
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from corl import redis_keys
from corl.proto import GradedBatch
from corl.redis_auth import redis_auth
from corl.streams import as_str, group_backlog

log = logging.getLogger(__name__)


def trainer_redis(url: str) -> redis.Redis:
    """The client a trainer reads its stream with: a Redis restart or failover is retried with backoff
    instead of killing the trainer."""
    return redis.Redis.from_url(
        url,
        **redis_auth(),
        socket_timeout=30.0,
        socket_connect_timeout=5.0,
        retry=Retry(ExponentialBackoff(cap=10.0, base=0.1), retries=8),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


@dataclass(frozen=True)
class Entry:
    entry_id: str
    batch: GradedBatch | None  # None: the entry is not a valid batch (or was trimmed away)
    error: str | None = None


class BatchStream:
    def __init__(self, client: redis.Redis, run: str, member: str, consumer: str, *, delete_acked: bool = True):
        self.client, self.run, self.member, self.consumer = client, run, member, consumer
        self.delete_acked = delete_acked
        self.stream = redis_keys.batches_stream(run, member)
        self.group = redis_keys.TRAINER_GROUP
        self._pending_cursor: str | None = "0"  # re-read own pending entries first
        self._inflight: set[str] = set()  # delivered and handled, waiting for commit

    def ensure_group(self) -> None:
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    def claim_dead(self, min_idle_ms: int) -> int:
        """Take over entries left pending by other consumers for at least ``min_idle_ms``."""
        claimed, cursor = 0, "0-0"
        while True:
            resp: Any = self.client.xautoclaim(
                self.stream, self.group, self.consumer, min_idle_time=min_idle_ms, start_id=cursor, count=100
            )
            cursor, entries = as_str(resp[0]), resp[1]
            # Our own in-flight entries are claimed back to ourselves too; only the others are news.
            claimed += sum(1 for e in entries if as_str(e[0]) not in self._inflight)
            for deleted in resp[2] if len(resp) > 2 else []:
                # Trimmed away while pending: nothing left to apply, acknowledge to clear it.
                self.client.xack(self.stream, self.group, deleted)
            if cursor == "0-0":
                break
        if claimed:
            log.info("claimed %d pending batch(es) of %s from other consumers", claimed, self.member)
            self._pending_cursor = "0"
        return claimed

    def next(self, block_ms: int) -> Entry | None:
        """The next entry to handle: own pending entries first, then new ones (blocking)."""
        while self._pending_cursor is not None:
            resp: Any = self.client.xreadgroup(self.group, self.consumer, {self.stream: self._pending_cursor}, count=16)
            entries = resp[0][1] if resp else []
            if not entries:
                self._pending_cursor = None
                break
            for eid, fields in entries:
                eid = as_str(eid)
                self._pending_cursor = eid
                if eid not in self._inflight:
                    return self._entry(eid, fields)
        resp = self.client.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=1, block=block_ms)
        if not resp or not resp[0][1]:
            return None
        eid, fields = resp[0][1][0]
        return self._entry(as_str(eid), fields)

    def _entry(self, eid: str, fields: dict | None) -> Entry:
        self._inflight.add(eid)
        raw = (fields or {}).get(b"batch") or (fields or {}).get("batch")
        if raw is None:
            return Entry(eid, None, "entry has no 'batch' field (trimmed or malformed)")
        try:
            return Entry(eid, GradedBatch.model_validate_json(raw))
        except ValidationError as err:
            return Entry(eid, None, f"invalid GradedBatch: {err.error_count()} error(s)")

    def commit(
        self,
        entry_ids: Iterable[str],
        *,
        applied: Iterable[str] = (),
        dropped: Iterable[str] = (),
        state: dict[str, int] | None = None,
    ) -> None:
        """Acknowledge entries and record their batch ids and the trainer state in one transaction."""
        ids, applied, dropped = list(entry_ids), list(applied), list(dropped)
        pipe = self.client.pipeline(transaction=True)
        if ids:
            pipe.xack(self.stream, self.group, *ids)
            if self.delete_acked:
                pipe.xdel(self.stream, *ids)
        if applied:
            pipe.sadd(redis_keys.trainer_applied(self.run, self.member), *applied)
        if dropped:
            pipe.sadd(redis_keys.trainer_dropped(self.run, self.member), *dropped)
        if state:
            pipe.hset(redis_keys.trainer_state(self.run, self.member), mapping=dict[Any, Any](state))
        pipe.execute()
        self._inflight.difference_update(ids)

    def published_version(self) -> int:
        v = self.client.hget(redis_keys.trainer_state(self.run, self.member), "published_version")
        return int(v) if v is not None else 0

    def record_version(self, version: int) -> None:
        """``version`` is published: its files exist."""
        self.client.hset(redis_keys.trainer_state(self.run, self.member), "published_version", version)

    def announced_version(self) -> int:
        v = self.client.hget(redis_keys.trainer_state(self.run, self.member), "announced_version")
        return int(v) if v is not None else 0

    def announce_version(self, version: int) -> None:
        """``version`` may be served before its files exist (a broadcast): recorded first, so that no
        trainer (this one restarted) ever numbers other weights with it."""
        self.client.hset(redis_keys.trainer_state(self.run, self.member), "announced_version", version)

    def record_transfer(self, transfer: str) -> None:
        """How this member's versions reach its servers now (files or broadcast): the run's stats show it."""
        self.client.hset(redis_keys.trainer_state(self.run, self.member), "weight_transfer", transfer)

    def backlog(self) -> int:
        """Entries not yet acknowledged by the group: undelivered plus pending."""
        counts = group_backlog(self.client, self.stream, self.group)
        return sum(counts) if counts else 0
