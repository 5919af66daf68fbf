"""A run's problems: the task's data source read, turned into the task's examples, and split into a
seeded RL split and a held-out evaluation split.

``load_splits(task_cfg, seed)`` is what the aggregator's prompt source and the held-out evaluation
both read, so they always agree on which problems are held out. Without a source the task's own
generator is used (addition). Dataset answers are canonicalised by the task and stay diagnostics.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from corl.tasks import Example, Splits, get_task

from .sources import PACKAGED, parse_source, read_file, read_packaged

if TYPE_CHECKING:
    from corl.config import TaskConfig

log = logging.getLogger(__name__)
# What the log line names of where problems came from: a package's name, version, sha256 and licence; a
# hub data set's repo, config, split, commit and rows.
PROVENANCE_KEYS = ("name", "version", "sha256", "license", "repo", "config", "split", "revision", "rows")


def read_records(task_cfg: TaskConfig, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Raw records of the configured source and where they came from."""
    assert task_cfg.source is not None
    kind, name = parse_source(task_cfg.source)
    if kind == "packaged":
        return read_packaged(name)
    if kind == "gym":
        from .gym import generate

        return generate(name, size=task_cfg.size, seed=seed, options=task_cfg.options)
    if kind == "hf":
        from .hub import read_hub

        return read_hub(name)
    return read_file(name), {"file": name}


def split_examples(
    examples: list[Example], seed: int, *, eval_size: int | None, eval_fraction: float, limit: int | None
) -> Splits:
    """Deduplicate by prompt, shuffle with ``seed``, keep ``limit``, hold out ``eval_size`` (or
    ``eval_fraction`` of them, at least one when there are two or more). Only problems that can be
    graded (a dataset answer or hidden tests) are held out; the others are RL prompts, which need none."""
    unique = list({e.prompt: e for e in examples}.values())
    random.Random(seed).shuffle(unique)
    if limit is not None:
        unique = unique[:limit]
    n_eval = eval_size if eval_size is not None else round(len(unique) * eval_fraction)
    if eval_size is None and eval_fraction > 0 and len(unique) >= 2:
        n_eval = max(1, n_eval)
    n_eval = min(n_eval, len(unique) - 1) if len(unique) > 1 else 0
    held = [e for e in unique if e.answer is not None or e.meta.get("test")][:n_eval]
    taken = {e.prompt for e in held}
    return Splits(warmup=[], rl=[e for e in unique if e.prompt not in taken], eval=held)


def load_splits(task_cfg: TaskConfig, seed: int = 0) -> Splits:
    """The RL and held-out splits of the run's task (seeded, deterministic)."""
    task = get_task(task_cfg.name)
    if task_cfg.source is None:
        return task.splits(seed)
    records, provenance = read_records(task_cfg, seed)
    examples = [task.example(r) for r in records]
    splits = split_examples(
        examples, seed, eval_size=task_cfg.eval_size, eval_fraction=task_cfg.eval_fraction, limit=task_cfg.limit
    )
    log.info(
        "task %s: %d problems from %s (%s), %d for RL and %d held out",
        task.name,
        len(examples),
        task_cfg.source,
        ", ".join(f"{k}={v}" for k, v in provenance.items() if k in PROVENANCE_KEYS),
        len(splits.rl),
        len(splits.eval),
    )
    return splits


__all__ = ["PACKAGED", "load_splits", "parse_source", "read_file", "read_records", "split_examples"]
