"""One run, one identity in every tracker, whichever process comes first.

The processes of a run share nothing but the cohort config and Redis, so the identity lives in Redis
(``redis_keys.tracking_run``): the first process to report claims the *run key*
(``<run_name>-<start time>``) with HSETNX and every other process reads the same one. A run started
again on fresh Redis gets a new key (a new run in every tool); ``corl run --resume``, a restarted
trainer or a redeployed pod finds the old one and goes on in the same tracker runs.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

import redis

from corl import redis_keys
from corl.redis_auth import redis_auth


def run_key(run_name: str, started: float) -> str:
    """``<run_name>-<YYYYmmdd-HHMMSS>`` with only the characters every tool takes in a name or id, short
    enough for a W&B run id (``<run key>-<process>``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", run_name).strip("-")[:40] or "run"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(started))}"


class SharedRun:
    """The run's tracker identity in Redis; safe to use from several worker threads."""

    def __init__(self, redis_url: str, run_id: str, run_name: str | None = None) -> None:
        self.run_id, self.run_name = run_id, run_name or run_id
        self._redis_url = redis_url
        self._client: redis.Redis | None = None
        self._key: str | None = None
        self._lock = threading.RLock()  # a candidate may ask for the key

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(
                self._redis_url, **redis_auth(), socket_timeout=5.0, socket_connect_timeout=5.0
            )
        return self._client

    def claim(self, field: str, candidate: Callable[[], str]) -> str:
        """The value of ``field``: the one already claimed, else ``candidate()``, stored unless another
        process stored its own first (then that one is returned: compare to see who won)."""
        name = redis_keys.tracking_run(self.run_id)
        with self._lock:
            current = self._redis().hget(name, field)
            if current is None:
                mine = candidate()
                if self._redis().hsetnx(name, field, mine):
                    return mine
                current = self._redis().hget(name, field)
            assert current is not None
            return current.decode() if isinstance(current, bytes) else str(current)

    def key(self) -> str:
        """The run key (claimed on first use, then cached)."""
        if self._key is None:
            self._key = self.claim("key", lambda: run_key(self.run_name, time.time()))
        return self._key

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
