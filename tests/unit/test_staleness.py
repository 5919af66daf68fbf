"""Staleness across a restart that renumbered weight versions: the jump is not training."""

from __future__ import annotations

import pytest

from corl.trainer.staleness import Renumbering, version_lag

# A crash after version 7 lost the steps after the checkpoint (taken at version 4); the checkpoint's
# weights were republished as version 8.
JUMP = Renumbering(newest_before=7, checkpoint=4, republished=8)


@pytest.mark.parametrize(
    ("current", "generated", "lag"),
    [
        (8, 4, 0),  # sampled by the checkpoint's weights: on-policy right after the restart
        (8, 2, 2),  # two versions behind the checkpoint, as it was before the crash
        (10, 2, 4),  # ... and two steps later
        (8, 6, 0),  # sampled by a lost step's weights, before the trainer re-applied that step
        (11, 6, 1),  # re-applied steps 5 and 6 (versions 9, 10), then one more
        (11, 9, 2),  # sampled after the jump: plain difference
    ],
)
def test_versions_before_the_jump_are_shifted_by_it(current: int, generated: int, lag: int) -> None:
    assert version_lag(current, generated, JUMP) == lag


def test_without_a_jump_the_lag_is_the_difference() -> None:
    assert version_lag(9, 4) == 5
