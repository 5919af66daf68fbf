"""A sharded checkpoint's index is read without running what it says (trainer/checkpoint_reader.py)."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict

from corl.trainer.checkpoint_reader import SafePlanner, SafeReader, UnsafeCheckpoint


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _save(tmp_path: Path) -> tuple[torch.nn.Module, torch.optim.Optimizer, Path]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(1, 3)).sum().backward()
    opt.step()
    model_sd, optim_sd = get_state_dict(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp_path / "ckpt")
    return model, opt, tmp_path / "ckpt"


def _load(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model_sd, optim_sd = get_state_dict(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"model": model_sd, "optim": optim_sd}, storage_reader=SafeReader(path), planner=SafePlanner())
    model.load_state_dict(model_sd)


def test_a_real_checkpoint_loads_through_the_safe_reader(tmp_path: Path) -> None:
    model, opt, path = _save(tmp_path)
    fresh = torch.nn.Linear(3, 2)
    _load(path, fresh, torch.optim.AdamW(fresh.parameters()))
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)


def test_an_index_that_would_run_code_is_refused_before_it_runs(tmp_path: Path) -> None:
    model, opt, path = _save(tmp_path)
    marker = tmp_path / "ran"
    (path / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointException, match=r"refers to posix\.system: refused"):  # dcp wraps rank errors
        _load(path, model, opt)
    assert not marker.exists()
    with pytest.raises(UnsafeCheckpoint):
        SafeReader(path).read_metadata()
