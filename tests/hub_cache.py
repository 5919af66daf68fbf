"""A Hugging Face cache built on disk, as ``huggingface_hub`` lays it out, for the offline hub tests
(no test reaches the Hub): ``<HF_HOME>/hub/models--org--name/{refs/<rev>, snapshots/<commit>/...}``
with a tiny cohort member saved there by transformers, and ``datasets--org--name`` with parquet
files and the README ``configs:`` block a Hub data set repository carries. Not a test module."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def commit_of(*parts: str) -> str:
    """A 40-hex commit id, made from ``parts`` (stable across runs)."""
    return hashlib.sha1("/".join(parts).encode()).hexdigest()


def _repo_dir(hub: Path, kind: str, repo: str) -> Path:
    return hub / f"{kind}--{repo.replace('/', '--')}"


def add_ref(hub: Path, repo: str, ref: str, commit: str, kind: str = "models") -> None:
    refs = _repo_dir(hub, kind, repo) / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / ref).write_text(commit)


def add_model(hub: Path, repo: str, family: str = "llama", *, ref: str = "main", seed: int = 0) -> str:
    """A tiny ``family`` member (the tiny preset's sizes, the project's char tokenizer) as the snapshot
    that ``ref`` of ``repo`` points to; returns its commit."""
    import torch
    from transformers import AutoModelForCausalLM

    from corl.cohort.presets import get_preset
    from corl.models.tokenizer import build_char_tokenizer

    commit = commit_of(repo, ref, str(seed))
    snapshot = _repo_dir(hub, "models", repo) / "snapshots" / commit
    (spec,) = [m for m in get_preset("tiny").members if m.family == family]
    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(spec.build_config(tok)).save_pretrained(snapshot)
    tok.save_pretrained(snapshot)
    add_ref(hub, repo, ref, commit)
    return commit


def add_dataset(hub: Path, repo: str, splits: dict[str, list[dict[str, Any]]], config: str = "main") -> str:
    """A data set repository whose ``main`` holds ``config`` with ``splits`` (parquet); returns its commit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    commit = commit_of(repo, config, json.dumps(splits, sort_keys=True))
    snapshot = _repo_dir(hub, "datasets", repo) / "snapshots" / commit
    (snapshot / config).mkdir(parents=True)
    files = []
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), snapshot / config / f"{split}-00000-of-00001.parquet")
        files.append(f"  - split: {split}\n    path: {config}/{split}-*\n")
    (snapshot / "README.md").write_text(f"---\nconfigs:\n- config_name: {config}\n  data_files:\n{''.join(files)}---\n")
    add_ref(hub, repo, "main", commit, kind="datasets")
    return commit
