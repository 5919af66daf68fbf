"""Running a weight group's ranks at once, in threads of one process (tests of ``corl.transfer``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def run_ranks(*jobs: Callable[[], Any]) -> list[Any]:
    """Run the ranks' calls at once; each result is its return value or the exception it raised."""
    out: list[Any] = [None] * len(jobs)

    def one(i: int) -> None:
        try:
            out[i] = jobs[i]()
        except Exception as err:  # noqa: BLE001 - the test inspects what each rank raised
            out[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out
