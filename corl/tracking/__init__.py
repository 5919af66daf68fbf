"""Experiment tracking: every process of a run reports to TensorBoard, W&B and MLflow, as configured.

Trainers report their steps (``<member>/train/...`` against the trainer's step), the aggregator each
committed round (``<member>/round/...`` and ``cohort/round/...`` against the round) and ``corl run``
the held-out readings as they come (``<member>/heldout/accuracy`` against the weight version). How
one corl run shows as one run in each tool, with a series per member: ``identity`` (a run key shared
through Redis), then each tracker's module. A tracker never stops a run: see ``worker``.
"""

from __future__ import annotations

from .build import build_tracking
from .records import Record
from .worker import Outcome, Tracking

__all__ = ["Outcome", "Record", "Tracking", "build_tracking"]
