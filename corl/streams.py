"""Reading a consumer group's backlog on any Redis with streams (6.2 included).

XINFO GROUPS reports ``lag`` only from Redis 7, so undelivered entries are counted with XRANGE
from the group's last-delivered id instead.
"""

from __future__ import annotations

from typing import Any

import redis


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def group_backlog(client: redis.Redis, stream: str, group: str, limit: int = 1000) -> tuple[int, int] | None:
    """(undelivered, pending) entries of ``group`` on ``stream`` (undelivered capped at ``limit``);
    None when the stream or the group does not exist."""
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:
        return None
    for g in groups:
        if _s(g["name"]) == group:
            undelivered = client.xrange(stream, min=f"({_s(g['last-delivered-id'])}", count=limit)
            return len(undelivered or []), int(g.get("pending") or 0)
    return None
