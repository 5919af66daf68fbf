"""A CPU snapshot of a model's weights for publishing: what a broadcast sends and its files are written
from, while training goes on. Pure torch: the trainer and ``bench/weight_sync.py`` share it."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def cpu_snapshot(
    state: Mapping[str, torch.Tensor], dtype: torch.dtype, into: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """``state``'s tensors as CPU tensors, floating-point ones in ``dtype`` (the servers' dtype), each
    storage once (tied weights, lm_head = embeddings, are sent and saved once, under the first name).
    ``into``: the last snapshot, reused where it fits: its memory is already touched, so the copy costs
    a memcpy, not page faults (a fresh 2.5 GB allocation costs four times the copy on this machine)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    devices: set[torch.device] = set()
    for name, t in state.items():
        if t.data_ptr() in seen and t.numel():
            continue
        seen.add(t.data_ptr())
        want = dtype if t.is_floating_point() else t.dtype
        buf = (into or {}).get(name)
        if buf is None or buf.shape != t.shape or buf.dtype != want:
            buf = torch.empty(t.shape, dtype=want, pin_memory=t.is_cuda)
        buf.copy_(t.detach(), non_blocking=t.is_cuda)
        if t.is_cuda:
            devices.add(t.device)
        out[name] = buf
    for device in devices:  # each tensor's own device: this thread's current one may be another
        torch.cuda.synchronize(device)
    return out
