"""The embedded run's cohort config: the same format as every service reads, with local defaults."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

from corl.config import CohortConfig, GatewayConfig, parse_config
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
    ``overrides`` are dotted config keys, plus ``teachers: start``: every trained member gets a
    frozen copy of its starting weights that votes for it (``with_start_teachers``).
    """
    if base is None:
        members = [
            {"name": n, "model": str((cohort_dir / n).resolve()), "servers": ["http://unassigned"]}
            for n in cohort_members(cohort_dir)
        ]
        data: dict = {"run_id": "embedded", "members": members}
    else:
        data = base.model_dump(mode="json")
    overrides = dict(overrides or {})
    teachers = overrides.pop("teachers", None)
    if teachers not in (None, "start"):
        raise ValueError(f"teachers={teachers!r}: the one kind of teacher is 'start' (the starting weights)")
    for key, value in overrides.items():
        set_path(data, key, value)
    if teachers == "start":
        data["members"] = with_start_teachers(data["members"])
    data["redis_url"] = redis_url
    data["weights_dir"] = str((run_dir / "weights").resolve())
    data["checkpoints_dir"] = str((run_dir / "checkpoints").resolve())
    tracking = data.setdefault("tracking", {})
    tracking["dir"] = tracking.get("dir") or str((run_dir / "tracking").resolve())
    cfg = parse_config(data)
    # An outside endpoint keeps its own address: corl starts no server for it.
    local = [
        m if m.endpoint is not None else m.model_copy(update={"servers": [f"http://127.0.0.1:{free_port()}"]})
        for m in cfg.members
    ]
    return cfg.model_copy(update={"members": local, "gateway": _local_gateway(cfg)})


def _local_gateway(cfg: CohortConfig) -> GatewayConfig:
    """A run that harvests (or names a gateway) gets one on loopback: the port of gateway.url, else a free one."""
    gw = cfg.gateway
    if gw.url is None and cfg.rounds.prompt_source.kind != "harvest":
        return gw
    port = (urlsplit(gw.url).port if gw.url else None) or free_port()
    return gw.model_copy(update={"url": f"http://127.0.0.1:{port}"})


def with_start_teachers(members: list[dict]) -> list[dict]:
    """``members`` and, for each trained one, ``<name>-start``: its starting model, frozen, voting
    for it alone beside its peers (Co-rewarding's slow teacher, at its slowest)."""
    teachers = [
        {**m, "name": f"{m['name']}-start", "role": "frozen", "teacher_of": m["name"], "lr": None}
        for m in members
        if m.get("role", "trained") == "trained"
    ]
    return [*members, *teachers]


def set_path(data: dict, dotted: str, value: object) -> None:
    """Set ``a.b.c`` in nested dicts (``rounds.max_rounds=20``)."""
    *parents, last = dotted.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
