"""The run-wide harvest counters (``corl:{run}:harvest:stats``, a Redis hash) as a ``HarvestStats``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import get_args

from corl.proto.gateway import DropReason, HarvestStats

_REASONS = frozenset(get_args(DropReason))


def _name(k: bytes | str) -> str:
    return k.decode() if isinstance(k, bytes) else k


def read_stats(raw: Mapping[bytes, bytes] | Mapping[str, str], pool: int) -> HarvestStats:
    """``raw``: the hash as Redis returns it; ``pool``: the pool stream's length."""
    counts = {_name(k): int(v) for k, v in raw.items()}
    dropped = {k.removeprefix("dropped:"): v for k, v in counts.items() if k.removeprefix("dropped:") in _REASONS}
    return HarvestStats(
        harvested=counts.get("harvested", 0),
        redacted=counts.get("redacted", 0),
        dropped=dropped,  # type: ignore[arg-type]
        trained_on=counts.get("trained_on", 0),
        pool=pool,
    )
