"""The GPUs of this node, as the device plan names them, found without initialising CUDA.

``CUDA_VISIBLE_DEVICES``, when set, is the node as far as this run is concerned (its ids, in its
order: a run started inside a slice of a node plans within that slice); else ``nvidia-smi -L``, else
the NVIDIA driver's ``/proc/driver/nvidia/gpus``; no NVIDIA driver: no GPUs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")


class NodeError(ValueError):
    """The GPUs asked for are not on this node."""


def visible(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The ids ``CUDA_VISIBLE_DEVICES`` lists (``[]`` for an empty value or ``-1``), None when unset."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    ids = [d.strip() for d in value.split(",") if d.strip()]
    return [] if not ids or ids[0] == "-1" else ids


def gpu_count(smi: str | None = None, driver: Path = DRIVER_GPUS) -> int:
    """GPUs on this machine: ``nvidia-smi -L`` lines (``smi``: its path; default: found on PATH), else the
    driver's entries, else 0."""
    smi = smi or shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        listed = [line for line in out.splitlines() if line.startswith("GPU ")]
        if listed:
            return len(listed)
    try:
        return sum(1 for _ in driver.iterdir())
    except OSError:
        return 0


def node_devices(limit: int | None = None, env: Mapping[str, str] | None = None, count: int | None = None) -> list[str]:
    """This node's GPU ids for the plan, at most ``limit`` of them (``--gpus``); ``NodeError`` when
    ``limit`` asks for more than there are. ``count`` replaces the detected number (tests)."""
    ids = visible(env)
    if ids is None:
        ids = [str(i) for i in range(gpu_count() if count is None else count)]
    if limit is None:
        return ids
    if limit > len(ids):
        raise NodeError(f"--gpus {limit}: this node has {len(ids)} GPU(s)" + (f" ({', '.join(ids)})" if ids else ""))
    return ids[:limit]
