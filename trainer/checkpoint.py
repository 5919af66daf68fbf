"""Durable trainer checkpoints: model (or LoRA adapter), optimizer, step, weight version, applied ids.

A checkpoint is written to a temporary folder, fsynced, then renamed to ``step-00000012``: a folder
with that name is always complete. The newest one is the resume point; older ones beyond ``keep``
are removed after the rename. A trainer group's checkpoint holds torch.distributed.checkpoint shards
(model and optimizer, each rank writing its own) instead of ``save_pretrained`` + ``optimizer.pt``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .publish import _fsync_dir, _fsync_tree

if TYPE_CHECKING:
    from .sharding import Sharding

log = logging.getLogger(__name__)

STATE = "trainer_state.json"
OPTIMIZER = "optimizer.pt"
SHARDED_METADATA = ".metadata"  # torch.distributed.checkpoint's index of the shards


@dataclass
class TrainerState:
    step: int = 0  # batches applied
    optimizer_steps: int = 0
    weight_version: int = 0  # newest version published from this lineage when the checkpoint was taken
    applied: list[str] = field(default_factory=list)  # batch ids, oldest first (bounded)


class Checkpointer:
    def __init__(self, root: str | Path, member: str, keep: int = 2):
        self.dir = Path(root) / member
        self.keep = keep
        self.dir.mkdir(parents=True, exist_ok=True)

    def checkpoints(self) -> list[Path]:
        done = [p for p in self.dir.glob("step-*") if p.is_dir() and (p / STATE).exists()]
        return sorted(done, key=lambda p: int(p.name.split("-", 1)[1]))

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, model, optimizer: torch.optim.Optimizer, state: TrainerState) -> Path:  # type: ignore[no-untyped-def]
        final = self.dir / f"step-{state.step:08d}"
        tmp = self.dir / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True)
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER)
        (tmp / STATE).write_text(json.dumps(asdict(state)))
        _fsync_tree(tmp)
        return self._commit(tmp, final, state)

    def save_sharded(self, model: Any, optimizer: torch.optim.Optimizer, state: TrainerState, group: Sharding) -> Path:
        """A trainer group's checkpoint (every rank calls it): each rank writes its shards of the model
        and optimizer with torch.distributed.checkpoint; the leader adds the state and renames."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        final = self.dir / f"step-{state.step:08d}"
        tmp = self.dir / f".tmp-{final.name}"  # one folder for the whole group: no pid in its name
        if group.leader:
            shutil.rmtree(tmp, ignore_errors=True)
        group.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        # Returns on the leader once every rank's shards are written and fsynced and the index is out.
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
        if not group.leader:
            return final
        (tmp / STATE).write_text(json.dumps(asdict(state)))
        _fsync_tree(tmp)
        return self._commit(tmp, final, state)

    def _commit(self, tmp: Path, final: Path, state: TrainerState) -> Path:
        """Rename the written folder into place (atomically), then prune the oldest."""
        if final.exists():  # same step saved again (e.g. on shutdown): replace it
            trash = self.dir / f".old-{final.name}-{os.getpid()}"
            os.rename(final, trash)
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(self.dir)
        for old in self.checkpoints()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint %s (version %d, %d applied ids)", final.name, state.weight_version, len(state.applied))
        return final

    @staticmethod
    def load_state(path: Path) -> TrainerState:
        return TrainerState(**json.loads((path / STATE).read_text()))

    @staticmethod
    def load_optimizer(path: Path, optimizer: torch.optim.Optimizer) -> None:
        optimizer.load_state_dict(torch.load(path / OPTIMIZER, map_location="cpu", weights_only=True))


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / SHARDED_METADATA).exists()


def load_sharded(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Every rank of a group loads its shards of a group checkpoint into ``model`` and ``optimizer``
    (its index and non-tensor entries read without running code: ``checkpoint_reader``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from .checkpoint_reader import SafePlanner, SafeReader

    model_sd, optim_sd = get_state_dict(model, optimizer)
    # In place, into these dicts.
    dcp.load({"model": model_sd, "optim": optim_sd}, storage_reader=SafeReader(path), planner=SafePlanner())
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
