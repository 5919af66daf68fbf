"""How many weight versions a batch is behind the trainer, across a restart that renumbered them.

A trainer that restarts from a checkpoint older than the newest published version (steps after
the checkpoint were lost in a crash) republishes the checkpoint's weights under a number above
everything published before, so versions never go back or collide. That jump is not training:
versions from before it are shifted by it, so the checkpoint's own version lines up with the one
it was republished as, and a version of the lost steps with the one the trainer reaches when it
has applied those steps again. Unshifted, every batch left in the stream (the ones applied after
the checkpoint included) would look older by the whole jump and could be dropped as stale instead
of being applied again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Renumbering:
    """A restart's jump: the checkpoint's weights (``checkpoint`` in the old numbering) republished
    as ``republished``, above ``newest_before``, the newest version published until then."""

    newest_before: int
    checkpoint: int
    republished: int


def version_lag(current: int, generated: int, renumbering: Renumbering | None = None) -> int:
    """Versions between the trainer's ``current`` one and the one that ``generated`` a batch."""
    if renumbering is None or generated > renumbering.newest_before:
        return current - generated
    shifted = generated + renumbering.republished - renumbering.checkpoint
    return max(0, current - shifted)  # a lost step's batch may meet the trainer before it re-applied that step
