"""Weights on disk: the one definition of a weights directory's checksum.

The checksum of a directory is sha256 over the bytes of every ``*.safetensors`` file directly in
it, in sorted file-name order, then of its ``adapter_config.json`` when it has one (a LoRA
adapter's scale, rank and targets are there: a changed config changes the weights served). Trainers
write it when they publish; model servers verify it before they swap. Pure file I/O: no torch.

The same bytes also have an XXH3-128 digest (``fast_digest``; trainers write it beside, as ``XXH3``):
a server checks that one when the update names it, ~20 GB/s on one core where sha256 does ~1.5. A
checksum passed around as a string is sha256 hex or ``xxh3-128:<hex>`` (``checksum_files`` computes
either).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_CHUNK = 1 << 22
ADAPTER_CONFIG = "adapter_config.json"
XXH3_PREFIX = "xxh3-128:"


class WeightsNotFoundError(FileNotFoundError):
    """The directory is missing or holds no ``*.safetensors`` file."""


def safetensors_files(directory: str | Path) -> list[Path]:
    """The directory's ``*.safetensors`` files in checksum order (sorted by file name)."""
    d = Path(directory)
    if not d.is_dir():
        raise WeightsNotFoundError(f"weights directory {str(d)!r} does not exist")
    files = sorted((p for p in d.iterdir() if p.suffix == ".safetensors" and p.is_file()), key=lambda p: p.name)
    if not files:
        raise WeightsNotFoundError(f"no *.safetensors file in {str(d)!r}")
    return files


def checksummed_files(directory: str | Path) -> list[Path]:
    """The files a directory's checksum covers, in order (see module docstring)."""
    files = safetensors_files(directory)
    config = Path(directory) / ADAPTER_CONFIG
    return [*files, config] if config.is_file() else files


def digest(directory: str | Path) -> str:
    """sha256 hex digest of a weights directory (see module docstring)."""
    return digest_files(checksummed_files(directory))


def recorded_digest(directory: str | Path, recorded: str) -> str:
    """The checksum to announce for a version recorded as ``recorded``. A LoRA version published before
    the checksum covered ``adapter_config.json`` was recorded over its tensors alone: when that record
    still matches the files, it is upgraded to the current definition (so a resumed run's servers take
    it). Anything else is announced as recorded, and a server that hashes it otherwise refuses it."""
    d = Path(directory)
    if not (d / ADAPTER_CONFIG).is_file() or digest_files(safetensors_files(d)) != recorded:
        return recorded
    return digest(d)


def fast_digest(directory: str | Path) -> str:
    """XXH3-128 hex digest of a weights directory: the same bytes as ``digest``."""
    return digest_files(checksummed_files(directory), xxh3=True)


def checksum_files(files: Iterable[Path], like: str) -> str:
    """The checksum of these files in the notation of ``like``: sha256 hex or ``xxh3-128:<hex>``."""
    if like.startswith(XXH3_PREFIX):
        return XXH3_PREFIX + digest_files(files, xxh3=True)
    return digest_files(files)


def digest_files(files: Iterable[Path], xxh3: bool = False) -> str:
    """The digest over these files' bytes, in the order given: sha256, or XXH3-128 (``xxh3``)."""
    h: Any
    if xxh3:
        import xxhash

        h = xxhash.xxh3_128()
    else:
        h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    for path in files:
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(buf):  # type: ignore[attr-defined]
                h.update(view[:n])  # hashlib releases the GIL on large updates
    return h.hexdigest()


def file_states(files: Iterable[Path]) -> list[tuple[int, int]]:
    """(size, mtime_ns) per file: compare before and after a load to detect a rewrite meanwhile."""
    return [(st.st_size, st.st_mtime_ns) for st in (p.stat() for p in files)]
