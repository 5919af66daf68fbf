"""Reading a trainer group's sharded checkpoint without running what the files say.

torch.distributed.checkpoint unpickles the checkpoint's index (``.metadata``) with plain ``pickle`` and
any non-tensor entry with ``torch.load(weights_only=False)``: whoever can write the checkpoint volume
could make a trainer run code. Here the index is unpickled with an allow-list (the checkpoint
library's own data classes, ``torch.Size``, dtypes, layouts, paths) and every entry with
``weights_only=True``; anything else is refused with ``UnsafeCheckpoint`` before it is built.
"""

from __future__ import annotations

import collections
import io
import pathlib
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_CHECKPOINT_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")


class UnsafeCheckpoint(pickle.UnpicklingError):
    """The checkpoint's index asks for something a checkpoint index never holds."""


def _layout(name: str) -> torch.layout:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.layout):
        raise UnsafeCheckpoint(f"the checkpoint index names an unknown layout {name!r}")
    return value


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): _layout,  # layouts are pickled as a call with the name ("torch.strided")
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _CHECKPOINT_MODULES:
            obj = super().find_class(module, name)
            if isinstance(obj, type):  # the library's data classes and enums, never a function
                return obj
        elif (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(f"the checkpoint index refers to {module}.{name}: refused (not a checkpoint type)")


def read_index(stream: Any) -> Metadata:
    index = _IndexUnpickler(stream).load()
    if not isinstance(index, Metadata):
        raise UnsafeCheckpoint(f"the checkpoint index is a {type(index).__name__}, not a Metadata")
    return index


class SafeReader(FileSystemReader):
    """FileSystemReader whose index is read with ``read_index``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        with self.fs.create_stream(self._get_metadata_path(rank), "rb") as stream:
            index = read_index(stream)
        meta = getattr(index, "storage_meta", None) or StorageMeta()
        meta.load_id = self.load_id
        index.storage_meta = meta
        return index


class SafePlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that loads non-tensor entries with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element  # as the default planner does

        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
