"""The embedded run's cohort config: the same format as every service reads, with local defaults."""

from __future__ import annotations

import json
from pathlib import Path

from corl.config import CohortConfig, parse_config
from corl.redis_server import free_port

DEFAULT_COHORT_DIR = Path("cohort/tiny")
# A Redis address where nothing answers: for a config planned before the run's Redis starts (preflight,
# resume checks) or used where no Redis is needed.
PLANNED_REDIS_URL = "redis://127.0.0.1:1/0"


def cohort_members(cohort_dir: Path) -> list[str]:
    """Member names of a cohort directory built by ``corl cohort init`` (from its manifest)."""
    manifest = json.loads((cohort_dir / "cohort.json").read_text())
    return [m["name"] for m in manifest["members"]]


def embedded_config(
    cohort_dir: Path,
    run_dir: Path,
    redis_url: str,
    *,
    base: CohortConfig | None = None,
    overrides: dict | None = None,
) -> CohortConfig:
    """Fill a config for local processes: loopback server ports, the run's Redis and store folders.

    ``base`` (a user's config) keeps its own rounds/reward/training sections; only addresses and
    folders are replaced. Without it every member of ``cohort_dir`` is trained with the defaults.
    """
    if base is None:
        members = [
            {"name": n, "model": str((cohort_dir / n).resolve()), "servers": ["http://unassigned"]}
            for n in cohort_members(cohort_dir)
        ]
        data: dict = {"run_id": "embedded", "members": members}
    else:
        data = base.model_dump(mode="json")
    for key, value in (overrides or {}).items():
        _set_path(data, key, value)
    data["redis_url"] = redis_url
    data["weights_dir"] = str((run_dir / "weights").resolve())
    data["checkpoints_dir"] = str((run_dir / "checkpoints").resolve())
    cfg = parse_config(data)
    local = [m.model_copy(update={"servers": [f"http://127.0.0.1:{free_port()}"]}) for m in cfg.members]
    return cfg.model_copy(update={"members": local})


def _set_path(data: dict, dotted: str, value: object) -> None:
    """Set ``a.b.c`` in nested dicts (``rounds.max_rounds=20``)."""
    *parents, last = dotted.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
