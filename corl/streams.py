"""Reading a consumer group's backlog on any Redis with streams (6.2 included).

XINFO GROUPS reports ``lag`` only from Redis 7, so undelivered entries are counted with XRANGE
from the group's last-delivered id instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import redis


def as_str(v: bytes | str) -> str:
    """A Redis reply field as text, whether or not the client decodes responses."""
    return v.decode() if isinstance(v, bytes) else str(v)


def find_group(groups: Iterable[Mapping[Any, Any]], group: str) -> Mapping[Any, Any] | None:
    """``group``'s entry in an XINFO GROUPS reply, or None when the group is absent."""
    return next((g for g in groups if as_str(g["name"]) == group), None)


def group_backlog(client: redis.Redis, stream: str, group: str, limit: int = 1000) -> tuple[int, int] | None:
    """(undelivered, pending) entries of ``group`` on ``stream`` (undelivered capped at ``limit``);
    None when the stream or the group does not exist."""
    try:
        g = find_group(client.xinfo_groups(stream), group)
    except redis.ResponseError:
        return None
    if g is None:
        return None
    undelivered = client.xrange(stream, min=f"({as_str(g['last-delivered-id'])}", count=limit)
    return len(undelivered or []), int(g.get("pending") or 0)
