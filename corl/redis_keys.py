"""Every Redis key name of a run, in one place: ``corl:{run}:<type>:<id>``."""

from __future__ import annotations


def _k(run: str, *parts: object) -> str:
    return ":".join(["corl", run, *map(str, parts)])


def batches_stream(run: str, member: str) -> str:
    """Graded batches for one member's trainer (stream, consumer group ``trainer``)."""
    return _k(run, "batches", member)


TRAINER_GROUP = "trainer"


def trainer_state(run: str, member: str) -> str:
    """Durable trainer record: applied batch ids, weight version (hash)."""
    return _k(run, "trainer", member)
