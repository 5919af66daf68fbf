"""The canary rule for live traffic (``gateway.canary``), as pure functions.

A canaried member has two sets of replicas: its ``servers`` (the trainer swaps every new version into
them; rounds sample them) and the gateway's *stable* replicas, which keep the *serving* version. While
the servers hold a newer version (the *candidate*) they get ``share`` of the member's gateway traffic.
Once the evaluator has read the candidate, it is promoted (swapped into the stable replicas: all traffic)
when its held-out accuracy is not worse than the serving version's by more than ``tolerance``, and
rolled back otherwise (its replicas get no traffic until the trainer publishes a newer version, the next
candidate). A candidate the trainer replaces before it is read is simply followed by the newer one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Decision = Literal["promote", "rollback", "wait"]


def decide(readings: Mapping[int, float], serving: int, candidate: int, tolerance: float) -> Decision:
    """What to do with ``candidate`` given the evaluator's accuracy per version: wait until both it and
    the serving version have a reading."""
    if candidate <= serving:
        return "wait"
    new, old = readings.get(candidate), readings.get(serving)
    if new is None or old is None:
        return "wait"
    return "promote" if new >= old - tolerance else "rollback"


def trained_share(
    serving: int, trained: int, rejected: frozenset[int], share: float, n_trained: int, n_all: int
) -> float:
    """Share of the member's traffic for its ``servers`` (the rest goes to the stable replicas).

    A candidate under canary gets ``share``; a rolled-back one none; servers at the serving version
    are ordinary replicas (an even split by count)."""
    if n_all == n_trained:
        return 1.0  # no stable replica: nothing to hold traffic back with
    if trained in rejected:
        return 0.0
    if trained > serving:
        return share
    return n_trained / n_all
