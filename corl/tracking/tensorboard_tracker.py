"""TensorBoard: event files under ``<tracking.dir>/tensorboard/<run key>/<process>/``.

A run is one folder; each process writes into its own subfolder. TensorBoard polls only the newest
event file of a folder for new data, so processes writing concurrently into one folder would hide
each other's live updates; with one subfolder each, ``tensorboard --logdir <dir>/tensorboard`` lists
the run's processes under its run key (filter on it to see the run alone) and tags
``<member>/<source>/<stat>`` group each member's series.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .identity import SharedRun
from .records import Record
from .worker import Outcome


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, root: Path, shared: SharedRun, process: str) -> None:
        self.root, self.shared, self.process = root, shared, process
        self._writer: Any = None

    def logdir(self) -> Path:
        return self.root / "tensorboard" / self.shared.key() / self.process

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter  # the writer TRL's report_to=tensorboard uses

        self._writer = SummaryWriter(log_dir=str(self.logdir()), flush_secs=10)

    def log(self, records: Sequence[Record]) -> None:
        for r in records:
            for tag, value in r.items():
                self._writer.add_scalar(tag, value, global_step=r.step, walltime=r.time)

    def close(self, outcome: Outcome) -> None:
        self._writer.close()
