"""What processes report to experiment trackers: one ``Record`` per event (a step, a round, a reading).

A record is a section (``<member>/train``, ``<member>/round``, ``<member>/heldout``, ``cohort/round``),
the x axis it is plotted against (``step``, ``round``, ``weight_version``) and its values. Keys are
``<section>/<name>``, so every tool groups a member's series together and no two processes ever write
the same key.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Record:
    """One section's values at one point of its x axis (``step`` counts ``axis``: steps, rounds, versions)."""

    section: str
    axis: str
    step: int
    values: Mapping[str, float]
    time: float = field(default_factory=time.time)  # when it was measured, not when a tracker got it

    @property
    def axis_key(self) -> str:
        return f"{self.section}/{self.axis}"

    def items(self) -> Iterator[tuple[str, float]]:
        """``(<section>/<name>, value)`` for every value."""
        for name, value in self.values.items():
            yield f"{self.section}/{name}", float(value)
