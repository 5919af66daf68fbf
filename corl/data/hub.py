"""Problems from a Hugging Face Hub data set: ``task.source: hf:<repo>[:<config>][@<split>]``.

Read with ``datasets.load_dataset``, which keeps its own cache (``HF_DATASETS_CACHE``, under
``HF_HOME``). Online, the repository's current commit is looked up first and loaded by that commit,
so the provenance names exactly what was read. With ``HF_HUB_OFFLINE`` set, a snapshot of the
repository in the hub cache (``hf download ID --repo-type dataset``) is read from disk at the commit
its ``main`` ref names; without one, ``datasets`` falls back to what it cached before. Records keep
the data set's own fields; the task reads the usual ones (``question``/``problem``/``prompt``,
``answer``/``solution``...).
"""

from __future__ import annotations

from typing import Any

from corl.hub import HubError, cache_dir, describe_error, offline

from .sources import HubSource, Record, parse_hub_source

EXTRA = "pip install 'corl[hub]'"


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise HubError(f"hf: data sources need the `datasets` package: {EXTRA}") from None
    return datasets


def _cached_snapshot(repo: str) -> tuple[str, str] | None:
    """(snapshot directory, commit) of ``repo``'s ``main`` in the hub cache, or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = snapshot_download(repo, repo_type="dataset", cache_dir=cache_dir(), local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return str(path), str(path).rstrip("/").rsplit("/", 1)[-1]


def _current_commit(repo: str, what: str) -> str:
    """The commit ``main`` of ``repo`` points to on the Hub now."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        sha = HfApi().dataset_info(repo).sha
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise HubError(describe_error(what, err, kind="dataset")) from None
    if not sha:
        raise HubError(f"{what}: the Hub named no commit for it")
    return sha


def read_hub(spec: str) -> tuple[list[Record], dict[str, Any]]:
    """The records of ``hf:<spec>`` (every split when none is named, in split-name order) and their
    provenance: repo, config, split, revision (the commit, or ``unknown`` read from ``datasets``'
    offline cache), rows."""
    src: HubSource = parse_hub_source(spec)
    what = f"hf:{spec}"
    datasets = _datasets()
    snapshot = _cached_snapshot(src.repo) if offline() else None
    if snapshot is not None:
        where, revision, kwargs = snapshot[0], snapshot[1], {}
    else:
        where = src.repo
        revision = "unknown" if offline() else _current_commit(src.repo, what)
        kwargs = {} if offline() else {"revision": revision}
    try:
        loaded = datasets.load_dataset(where, src.config, split=src.split, **kwargs)
    except (OSError, ValueError) as err:  # a missing or gated set, an unknown config or split
        raise HubError(f"{what}: {err}") from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = sorted(loaded)
        parts = [loaded[k] for k in splits]
    else:
        splits, parts = [src.split or str(loaded.split)], [loaded]
    records = [dict(r) for part in parts for r in part]
    provenance = {
        "repo": src.repo,
        "config": src.config or "default",
        "split": "+".join(splits),
        "revision": revision,
        "rows": len(records),
    }
    return records, provenance
