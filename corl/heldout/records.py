"""Held-out readings where others read them: the run's Redis hash (``redis_keys.heldout_accuracy``,
read by the aggregator's stats and dashboard) and the experiment trackers."""

from __future__ import annotations

from collections.abc import Mapping

import redis
from pydantic import ValidationError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from corl import redis_keys
from corl.proto import HeldoutAccuracy
from corl.tracking import Record

HELDOUT_TTL_S = 30 * 86400  # renewed with every reading: a live run's readings never expire


def write_reading(client: redis.Redis, run: str, member: str, reading: HeldoutAccuracy, *, attempts: int = 3) -> None:
    """Set ``member``'s reading in the run's hash and renew the hash's TTL, in one transaction, retried
    with jittered back-off (the write is idempotent). Raises ``redis.RedisError`` after ``attempts``."""
    key = redis_keys.heldout_accuracy(run)
    for attempt in Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=0.2, max=2.0, jitter=0.2),
        retry=retry_if_exception_type(redis.RedisError),
        reraise=True,
    ):
        with attempt:
            pipe = client.pipeline()
            pipe.hset(key, member, reading.model_dump_json())
            pipe.expire(key, HELDOUT_TTL_S)
            pipe.execute()


def read_readings(raw: Mapping[bytes, bytes]) -> dict[str, HeldoutAccuracy]:
    """member -> reading from the hash (an ``HGETALL`` reply); an entry that does not parse is skipped."""
    out: dict[str, HeldoutAccuracy] = {}
    for member, value in raw.items():
        try:
            out[member.decode()] = HeldoutAccuracy.model_validate_json(value)
        except (ValidationError, UnicodeDecodeError):
            continue
    return out


def tracking_record(member: str, reading: HeldoutAccuracy) -> Record:
    """The reading for experiment trackers: ``<member>/heldout/accuracy`` against the weight version."""
    return Record(f"{member}/heldout", "weight_version", reading.weight_version, {"accuracy": reading.accuracy})
