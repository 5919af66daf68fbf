"""When a member's held-out accuracy is read (again): one rule for ``corl run`` and the evaluator."""

from __future__ import annotations


def is_due(last_version: int | None, version: int | None, every: int) -> bool:
    """A reading is due when the member has none yet (the start reading, before any training), and
    again once the weights its server answers with are ``every`` versions past the last reading's.
    ``version`` None (the server did not say) is never a reason to read again: only a first reading
    is tried blind. A frozen member's version never moves, so it is read once."""
    if last_version is None:
        return True
    return version is not None and version >= last_version + every
