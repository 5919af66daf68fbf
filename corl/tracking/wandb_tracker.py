"""Weights & Biases: one W&B run per process, the run's processes in one group.

W&B documents two ways for several processes: one run per process, grouped (``group=``), or all
processes in one run (its "shared" mode, which needs the W&B server and so does not work offline). A
group works online and offline alike and is shown as one row of the runs table: the group is the run
key, each process a run in it named after the process (``trainer-<member>``, ``aggregator``,
``supervisor``) with a fixed id (``<run key>-<process>``, ``resume="allow"``), so a restarted process
goes on in its own run. Each section's values are plotted against their own axis
(``define_metric(step_metric=...)``): a trainer's step, a round, a weight version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from corl.config import WandbConfig

from .identity import SharedRun
from .records import Record
from .worker import Outcome


class WandbTracker:
    name = "wandb"

    def __init__(
        self,
        cfg: WandbConfig,
        project: str,
        root: Path,
        shared: SharedRun,
        process: str,
        config: Mapping[str, Any],
    ) -> None:
        self.cfg, self.project, self.root, self.shared, self.process = cfg, project, root, shared, process
        self.config = dict(config)
        self._run: Any = None
        self._sections: set[str] = set()

    def open(self) -> None:
        import wandb

        key = self.shared.key()
        self.root.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=self.project,
            entity=self.cfg.entity,
            group=key,
            job_type=self.process.split("-", 1)[0],
            name=self.process,
            id=f"{key}-{self.process}",
            resume="allow",
            dir=str(self.root),
            mode=self.cfg.mode,
            config=self.config,
            reinit="create_new",  # tests and tools may hold several runs in one process
            # corl logs for itself: W&B neither captures the process's console nor prints to it.
            settings=wandb.Settings(console="off", silent=True, save_code=False),
        )

    def log(self, records: Sequence[Record]) -> None:
        for r in records:
            if r.section not in self._sections:
                self._run.define_metric(r.axis_key)
                self._run.define_metric(f"{r.section}/*", step_metric=r.axis_key)
                self._sections.add(r.section)
            self._run.log({r.axis_key: r.step, **dict(r.items())})

    def close(self, outcome: Outcome) -> None:
        self._run.finish(exit_code=0 if outcome == "finished" else 1)
