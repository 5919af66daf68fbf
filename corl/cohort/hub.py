"""A cohort of Hugging Face Hub models: ``corl cohort init --from-hub ID...``.

Each id (``org/name[@revision]``, optionally ``=member-name``) is resolved once and pinned to the
commit it points to (``corl.hub``); the cohort directory gets a link per member to that snapshot in
the hub cache and a manifest (``cohort.json``) recording id, commit, family and size, so ``corl run
--cohort DIR`` trains exactly those snapshots, however the branches move later.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from corl.hub import HubError, HubModel, locate, member_name, parse_id
from corl.preflight import model_shape

from .manifest import CohortManifest, HubRecord, MemberRecord, write_manifest

PRESET = "hub"


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``org/name[@rev][=member]`` -> (hub id, member name or None); ``HubError`` when malformed."""
    model_id, _, name = spec.partition("=")
    if parse_id(model_id) is None:
        raise HubError(f"{spec!r}: expected a hub id, org/name[@revision][=member-name]")
    return model_id, name or None


def member_names(specs: list[str]) -> list[tuple[str, str]]:
    """(hub id, member name) per spec: the name given, else one made from the repository's, numbered
    when two would be the same."""
    out: list[tuple[str, str]] = []
    taken: set[str] = set()
    for spec in specs:
        model_id, given = parse_spec(spec)
        parsed = parse_id(model_id)
        assert parsed is not None
        base = given or member_name(parsed[0])
        name, n = base, 2
        while name in taken:
            name, n = f"{base[:37]}-{n}", n + 1
        if given and given in taken:
            raise HubError(f"member name {given!r} given twice")
        taken.add(name)
        out.append((model_id, name))
    return out


def build_hub_cohort(
    out: Path, specs: list[str], progress: Callable[[str, str, str], None] = lambda *_: None
) -> CohortManifest:
    """Resolve, fetch and link every spec's model into ``out`` and write its manifest. Every id is
    resolved before any is fetched in full, so a missing one fails first (``HubError``)."""
    from corl.hub import fetch

    t0 = time.monotonic()
    named = member_names(specs)
    located: list[tuple[str, HubModel]] = []
    for model_id, name in named:
        progress(name, "resolve", model_id)
        located.append((name, locate(model_id)))
    out.mkdir(parents=True, exist_ok=True)
    members = []
    for name, found in located:
        progress(name, "fetch", f"{found.id} @ {found.commit[:12]}")
        model = fetch(found)
        link = out / name
        if link.is_symlink() or link.exists():
            if not link.is_symlink():
                raise HubError(f"{link} exists and is not a link this command made: choose another --out")
            link.unlink()
        link.symlink_to(model.path, target_is_directory=True)
        family = str(json.loads((Path(model.path) / "config.json").read_text()).get("model_type", "unknown"))
        members.append(
            MemberRecord(
                name=name,
                family=family,
                path=name,
                params=model_shape(model.path).params,
                hub=HubRecord(id=model.id, repo=model.repo, revision=model.revision, commit=model.commit),
            )
        )
        progress(name, "done", model.path)
    manifest = CohortManifest(
        preset=PRESET,
        members=members,
        total_seconds=time.monotonic() - t0,
        description="Hugging Face Hub models, pinned",
    )
    write_manifest(manifest, out)
    return manifest
