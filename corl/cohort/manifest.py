"""The cohort manifest (``cohort.json``): what each member is and how its warm-up ended."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from rich.table import Table

MANIFEST = "cohort.json"


class MemberRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    family: str
    path: str  # relative to the cohort directory
    params: int
    warmup_steps: int
    warmup_seconds: float
    accuracy: float  # greedy accuracy on the task's held-out split when warm-up stopped
    in_band: bool
    rollbacks: int = 0


class CohortManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: str
    task: str
    seed: int
    band: tuple[float, float] | None
    members: list[MemberRecord]
    total_seconds: float

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
            f"{m.warmup_seconds:.1f}",
            f"{m.accuracy:.1%}",
            "yes" if m.in_band else "no",
        )
    table.caption = f"total {manifest.total_seconds:.1f} s"
    return table
