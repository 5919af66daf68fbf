"""The transformers backend's model slots: one serving, one spare (see ``transformers``). A slot owns
its model and a name -> tensor map of its weights, into which a new version lands in place: from
files (``copy_in``) or from the member's weight group (``receive``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from corl.transfer import FingerprintMismatch, TransferError, TransferGroup, TransferRefused
from corl.transfer.shared import SharedRef

from .base import Manifest, TransferAbortedError, WeightGroupError, WeightLoadError


@dataclass
class Slot:
    model: PreTrainedModel
    version: int
    leases: int = 0
    merged: frozenset[str] = frozenset()  # weights an adapter has changed from the initial ones
    targets: dict[str, torch.Tensor] = field(init=False, repr=False)  # state-dict name -> live tensor

    def __post_init__(self) -> None:
        self.targets = dict(self.model.state_dict())

    @torch.no_grad()
    def copy_in(self, files: Sequence[Path]) -> None:
        """Copy the safetensors ``files`` straight into the slot's tensors (``load_state_dict``'s module
        walk costs more than the copy); an unreadable file is a ``WeightLoadError``."""
        for f in files:
            try:
                tensors = load_file(f)
            except Exception as err:  # noqa: BLE001 - any parse failure is a bad file
                raise WeightLoadError(f"{f.name} is not a readable safetensors file: {err}") from None
            for name, tensor in tensors.items():
                self.targets[name].copy_(tensor)

    @torch.no_grad()
    def receive(self, group: TransferGroup, version: int, manifest: Manifest, segment: SharedRef | None = None) -> None:
        """Take ``version`` from ``group`` into the slot's tensors, fingerprints checked. Raises
        ``TransferAbortedError`` when a rank said no (nothing written), ``WeightLoadError`` on a
        fingerprint mismatch and ``WeightGroupError`` when the group broke (both: the slot is half
        written, and marked so that a later adapter resets every weight)."""
        names = [name for name, _, _ in manifest]
        targets = [self.targets[n] for n in names]
        # Tensors land in place; a rare non-contiguous one comes through a contiguous copy.
        dests = [t if t.is_contiguous() else t.contiguous() for t in targets]
        try:
            group.receive(version, names, dests, segment=segment)
            for target, dest in zip(targets, dests, strict=True):
                if dest is not target:
                    target.copy_(dest)
        except TransferRefused as err:  # nothing was written
            raise TransferAbortedError(str(err)) from None
        except BaseException as err:
            self.merged = frozenset(self.targets)
            if isinstance(err, FingerprintMismatch):
                raise WeightLoadError(str(err), field="tensors") from None
            if isinstance(err, TransferError):
                raise WeightGroupError(str(err)) from None
            raise
        self.version, self.merged = version, frozenset(self.targets)
