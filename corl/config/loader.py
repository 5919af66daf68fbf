"""The cohort config as a YAML file: read (every wrong field reported at once), relative paths
resolved against the file's directory, and written back."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from .cohort import CohortConfig


class ConfigError(ValueError):
    """A config file that cannot be used; the message lists every problem."""


def _format_errors(err: ValidationError) -> str:
    lines = [f"{len(err.errors())} problem(s) in the cohort config:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        lines.append(f"  - {loc}: {e['msg']}")
    return "\n".join(lines)


def parse_config(data: object, base_dir: Path | None = None) -> CohortConfig:
    try:
        cfg = CohortConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None
    return _resolve_paths(cfg, base_dir) if base_dir else cfg


def load_config(path: str | Path) -> CohortConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read cohort config {path}: {err}") from None
    return parse_config(data, path.resolve().parent)


def dump_config(cfg: CohortConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


def _resolve(p: str, base: Path) -> str:
    if "://" in p:
        return p
    q = Path(p).expanduser()
    if q.is_absolute():
        return str(q)
    resolved = base / q
    # A relative name that is not a local path may be a hub id ("org/model"): keep it as given.
    return str(resolved) if resolved.exists() or not _looks_like_hub_id(p) else p


def _looks_like_hub_id(p: str) -> bool:
    return p.split("@", 1)[0].count("/") == 1 and not p.startswith(".")  # org/name[@revision]


def _resolve_dir(p: str | None, base: Path) -> str | None:
    return None if p is None else str((base / Path(p).expanduser()).resolve())


def _resolve_paths(cfg: CohortConfig, base: Path) -> CohortConfig:
    members = [m if m.model is None else m.model_copy(update={"model": _resolve(m.model, base)}) for m in cfg.members]
    src = cfg.rounds.prompt_source
    if src.path:
        src = src.model_copy(update={"path": str((base / src.path).resolve())})
    task = cfg.task
    if task.source is not None and task.is_file():
        task = task.model_copy(update={"source": str((base / Path(task.source).expanduser()).resolve())})
    return cfg.model_copy(
        update={
            "task": task,
            "members": members,
            "weights_dir": str((base / cfg.weights_dir).resolve()),
            "checkpoints_dir": str((base / cfg.checkpoints_dir).resolve()),
            "rounds": cfg.rounds.model_copy(update={"prompt_source": src}),
            "tracking": cfg.tracking.model_copy(update={"dir": _resolve_dir(cfg.tracking.dir, base)}),
        }
    )
