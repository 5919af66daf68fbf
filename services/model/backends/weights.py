"""Verifying a weight update, the same way for every backend: the version only moves forward, the
files hash to the checksum the trainer published, every tensor name and shape matches the serving
model (read from the safetensors headers, before any data is loaded), and a LoRA update is an
adapter directory. A swap re-checks the files' size and mtime right before it loads them, so a
directory rewritten after its check is refused instead of half-trusted. A broadcast's manifest
(``check_manifest``) is held to the same names and shapes, and to the serving dtypes."""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path

from corl import weights_store

from .base import StaleVersionError, WeightLoadError

TensorSpec = dict[str, tuple[int, ...]]
FileStates = list[tuple[int, int]]
ADAPTER_CONFIG = weights_store.ADAPTER_CONFIG


def check_newer(version: int, serving: int) -> None:
    if version <= serving:
        raise StaleVersionError(f"version {version} is not newer than the serving version {serving}")


def files_of(path: str | Path) -> tuple[list[Path], FileStates]:
    """The directory's ``*.safetensors`` files (checksum order) and their (size, mtime)."""
    try:
        files = weights_store.safetensors_files(path)
        return files, weights_store.file_states(files)
    except OSError as err:
        raise WeightLoadError(str(err), field="uri") from None


def check_unchanged(files: list[Path], states: FileStates) -> None:
    try:
        same = weights_store.file_states(files) == states
    except OSError:
        same = False
    if not same:
        raise WeightLoadError("weight files changed after they were verified", field="uri")


def check_digest(got: str, checksum: str) -> None:
    """``checksum``: sha256 hex or ``xxh3-128:<hex>`` (``weights_store.checksum_files``)."""
    if got != checksum:
        xxh3 = checksum.startswith(weights_store.XXH3_PREFIX)
        what, field = ("xxh3-128", "xxh3_128") if xxh3 else ("sha256", "sha256")
        raise WeightLoadError(f"{what} mismatch: files hash to {got}, request says {checksum}", field=field)


def safetensors_spec(path: Path) -> TensorSpec:
    """Tensor names and shapes from a safetensors header (the data is not read); ``WeightLoadError``
    if the file is not a complete safetensors file (bad header, or shorter than the header says)."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        spec = {k: tuple(v["shape"]) for k, v in tensors.items()}
        end = max((v["data_offsets"][1] for v in tensors.values()), default=0)
    except Exception as err:  # noqa: BLE001 - any parse failure means a bad file
        raise WeightLoadError(f"{path.name} is not a readable safetensors file: {err}") from None
    if 8 + size + end > path.stat().st_size:
        raise WeightLoadError(f"{path.name} is truncated: {path.stat().st_size} bytes, header needs {8 + size + end}")
    return spec


def files_spec(files: list[Path]) -> TensorSpec:
    spec: TensorSpec = {}
    for f in files:
        spec.update(safetensors_spec(f))
    return spec


def check_spec(spec: TensorSpec, reference: TensorSpec, aliases: Mapping[str, frozenset[str]] | None = None) -> None:
    """Every tensor of ``spec`` exists in ``reference`` with the same shape, and every reference tensor
    is present; ``aliases`` groups names that share storage (tied embeddings): one of a group suffices."""
    unknown = sorted(k for k in spec if k not in reference)
    if unknown:
        raise WeightLoadError(f"tensors not in the serving model: {unknown[:5]}")
    wrong = [f"{k}: {spec[k]} != {reference[k]}" for k in spec if tuple(spec[k]) != tuple(reference[k])]
    if wrong:
        raise WeightLoadError(f"tensor shape mismatch: {wrong[:5]}")
    groups = aliases or {}
    missing = sorted(k for k in reference if not (groups.get(k, frozenset((k,))) & spec.keys()))
    if missing:
        raise WeightLoadError(f"tensors missing from the new weights: {missing[:5]}")


def check_manifest(
    manifest: Sequence[tuple[str, str, tuple[int, ...]]],
    reference: TensorSpec,
    dtypes: Mapping[str, str],
    aliases: Mapping[str, frozenset[str]] | None = None,
) -> None:
    """A broadcast's manifest, (name, dtype, shape) per tensor, fits the serving model: the names and
    shapes as for files (``check_spec``), each name once, and each dtype the serving tensor's own (a
    broadcast lands in place: nothing casts it)."""
    counts = Counter(name for name, _, _ in manifest)
    twice = sorted(n for n, c in counts.items() if c > 1)
    if twice:
        raise WeightLoadError(f"tensors named twice in the manifest: {twice[:5]}", field="tensors")
    spec = {name: tuple(shape) for name, _, shape in manifest}
    try:
        check_spec(spec, reference, aliases)
    except WeightLoadError as err:
        raise WeightLoadError(str(err), field="tensors") from None
    wrong = [f"{n}: {d} != {dtypes[n]}" for n, d, _ in manifest if dtypes.get(n, d) != d]
    if wrong:
        raise WeightLoadError(f"tensor dtype mismatch (send the serving dtype): {wrong[:5]}", field="tensors")


def verify_full(
    path: str, sha256: str, reference: TensorSpec, aliases: Mapping[str, frozenset[str]] | None = None
) -> tuple[list[Path], FileStates]:
    """Names and shapes from the headers, then the checksum over the bytes; returns what a swap
    passes to ``check_unchanged`` right before loading."""
    files, states = files_of(path)
    check_spec(files_spec(files), reference, aliases)
    check_digest(weights_store.checksum_files(files, sha256), sha256)
    check_unchanged(files, states)
    return files, states


def verify_adapter(path: str, sha256: str) -> tuple[list[Path], FileStates]:
    """A PEFT adapter directory with its checksum (whether it fits the model, PEFT tells on load)."""
    if not (Path(path) / ADAPTER_CONFIG).is_file():
        raise WeightLoadError(f"{path!r} has no {ADAPTER_CONFIG} (format 'lora')", field="uri")
    files, states = files_of(path)
    files_spec(files)  # complete, readable files
    hashed = weights_store.checksummed_files(path)  # the adapter's config too: its scale is in it
    hashed_states = weights_store.file_states(hashed)
    check_digest(weights_store.checksum_files(hashed, sha256), sha256)
    check_unchanged(hashed, hashed_states)
    return files, states


def load_verified(
    path: str,
    sha256: str,
    reference: TensorSpec,
    aliases: Mapping[str, frozenset[str]] | None,
    load: Callable[[list[Path]], None],
    hasher: Executor,
) -> None:
    """Check names and shapes from the headers, then run ``load(files)`` while ``hasher`` computes the
    checksum over the same files; the digest and the files' (size, mtime) are checked once both are
    done. ``load`` must write only into a copy that is not serving: on any error it is discarded."""
    files, states = files_of(path)
    check_spec(files_spec(files), reference, aliases)
    hashed = hasher.submit(weights_store.checksum_files, files, sha256)
    try:
        load(files)
    finally:
        got = hashed.result()  # always joined: no hash thread outlives its swap
    check_digest(got, sha256)
    check_unchanged(files, states)
