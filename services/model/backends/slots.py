"""The transformers backend's model slots: one serving, one spare (see ``transformers``). A slot owns
its model and a name -> tensor map of its weights, into which a new version lands in place: from
files (``copy_in``) or from the member's weight group (``receive``). From a trainer on the same host, a
version is not copied at all: the slot's weights become the pages of the trainer's shared-memory
segment (``segment`` names it) until a later version replaces them; a write into them first gives
the slot its own memory again (``own``)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from corl.transfer import FingerprintMismatch, TransferError, TransferGroup, TransferRefused, dtype_of
from corl.transfer.shared import SharedRef

from .base import Manifest, TransferAbortedError, WeightGroupError, WeightLoadError


@dataclass
class Slot:
    model: PreTrainedModel
    version: int
    leases: int = 0
    merged: frozenset[str] = frozenset()  # weights an adapter has changed from the initial ones
    segment: str | None = None  # the trainer's segment whose pages the weights are (``receive``), if any
    targets: dict[str, torch.Tensor] = field(init=False, repr=False)  # state-dict name -> live tensor

    def __post_init__(self) -> None:
        self.targets = dict(self.model.state_dict())

    @torch.no_grad()
    def own(self) -> None:
        """Weights in this process's own memory again (before anything writes into them): a write into a
        borrowed page would copy it page by page and keep the segment's memory held as well."""
        if self.segment is None:
            return
        for tensors in (self.model.parameters(), self.model.buffers()):
            for t in tensors:
                t.data = t.data.clone()
        self.targets = dict(self.model.state_dict())
        self.segment = None

    @torch.no_grad()
    def copy_in(self, files: Sequence[Path]) -> None:
        """Copy the safetensors ``files`` straight into the slot's tensors (``load_state_dict``'s module
        walk costs more than the copy); an unreadable file is a ``WeightLoadError``."""
        self.own()
        for f in files:
            try:
                tensors = load_file(f)
            except Exception as err:  # noqa: BLE001 - any parse failure is a bad file
                raise WeightLoadError(f"{f.name} is not a readable safetensors file: {err}") from None
            for name, tensor in tensors.items():
                self.targets[name].copy_(tensor)

    @torch.no_grad()
    def receive(
        self,
        group: TransferGroup,
        version: int,
        manifest: Manifest,
        segment: SharedRef | None = None,
        holding: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """Take ``version`` from ``group`` into the slot's tensors, fingerprints checked; through a
        trainer's ``segment`` the slot's tensors become its pages instead, and ``holding()`` then names
        the segments this process's weights lie in (every slot's), for the trainer. Raises
        ``TransferAbortedError`` when a rank said no (nothing written), ``WeightLoadError`` on a
        fingerprint mismatch and ``WeightGroupError`` when the group broke (both: the slot is half
        written, and marked so that a later adapter resets every weight)."""
        names = [name for name, _, _ in manifest]
        pages = group.borrow(segment, [(dtype_of(d), s) for _, d, s in manifest]) if segment is not None else None
        try:
            if pages is not None:
                assert segment is not None

                def adopt(views: Sequence[torch.Tensor]) -> Collection[str]:
                    self._adopt(names, views, segment.name)
                    return holding()

                group.receive(version, names, pages, segment=segment, adopt=adopt)
            else:
                self.own()
                self._receive_into(group, version, names, segment)
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

    def _receive_into(self, group: TransferGroup, version: int, names: list[str], segment: SharedRef | None) -> None:
        targets = [self.targets[n] for n in names]
        # Tensors land in place; a rare non-contiguous one comes through a contiguous copy.
        dests = [t if t.is_contiguous() else t.contiguous() for t in targets]
        group.receive(version, names, dests, segment=segment)
        for target, dest in zip(targets, dests, strict=True):
            if dest is not target:
                target.copy_(dest)

    def _adopt(self, names: Sequence[str], views: Sequence[torch.Tensor], segment: str) -> None:
        """The slot's weights become ``views`` (a segment's pages): each named parameter or buffer is
        pointed at its view; the tensors it had are let go (so is the segment they were in, if any)."""
        point_at(self.model, names, views)
        self.targets = dict(self.model.state_dict())
        self.segment = segment


def point_at(model: torch.nn.Module, names: Sequence[str], views: Sequence[torch.Tensor]) -> None:
    """Each named parameter or buffer of ``model`` becomes its view (no copy; tied names share the
    parameter, so all of them follow)."""
    for name, view in zip(names, views, strict=True):
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        param = module._parameters.get(attr)
        if param is not None:
            param.data = view
        else:
            module._buffers[attr] = view
