"""Models from the Hugging Face Hub: a member's ``model: org/name[@revision]``, resolved once.

``corl run`` (and ``corl eval``, ``corl experiment``) resolve every hub id of the config through
``huggingface_hub`` before anything starts: the revision (a branch, a tag, a commit; ``main`` when
none is given) becomes the commit it points to now, the snapshot of that commit is fetched into the
Hugging Face cache (config, tokenizer and safetensors files only), and the member's ``model`` becomes
that snapshot directory, which every process of the run loads and the preflight reads. The pins go to
``hub.json`` in the run directory: a resume resolves the same ids to the same commits, whatever the
branch points to by then.

The cache, the token and offline mode come from the environment as ``huggingface_hub`` reads them
(``HF_HOME``, ``HF_HUB_CACHE``, ``HF_TOKEN``, ``HF_HUB_OFFLINE``), read when a model is resolved. A
model that is missing, gated, private or absent from the cache in offline mode is a ``HubError``
naming its id.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corl.config import CohortConfig

PINS_FILE = "hub.json"  # in the run directory: hub id -> the commit and snapshot the run uses
# What a member needs of a repository: its config, tokenizer and weights (never pickles or code).
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class HubError(RuntimeError):
    """A hub model or data set that cannot be used; the message names its id and what to do."""


@dataclass(frozen=True)
class HubModel:
    """One hub id as the run uses it."""

    id: str  # as written in the config: org/name[@revision]
    repo: str
    revision: str  # the revision asked for (main when none)
    commit: str  # what it resolved to
    path: str  # the snapshot directory of that commit


def parse_id(text: str) -> tuple[str, str | None] | None:
    """``("org/name", "rev")`` of ``org/name@rev`` (revision None when not given); None when ``text``
    is not a hub id."""
    m = _ID.match(text)
    return (m["repo"], m["revision"]) if m else None


def is_hub_id(model: str) -> bool:
    """A member's ``model`` names a hub repository: it has the form of one and is no local path."""
    return parse_id(model) is not None and not Path(model).expanduser().exists()


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to a true value: only the cache is read."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in ("1", "on", "yes", "true")


def cache_dir() -> str:
    """The hub cache as ``huggingface_hub`` finds it, read from the environment now."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return os.path.join(os.path.expanduser(home), "hub")


def describe_error(what: str, err: Exception, *, kind: str = "model") -> str:
    """A ``huggingface_hub`` error as one line naming ``what`` (an id) and what to do about it;
    ``kind``: ``model`` or ``dataset``."""
    from huggingface_hub import errors

    page = f"https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}{what.split('@')[0]}"
    if isinstance(err, errors.GatedRepoError):
        return f"{what} is gated: accept its terms on {page} with your account and set HF_TOKEN (or `hf auth login`)"
    if isinstance(err, errors.RevisionNotFoundError):
        return f"{what}: no such revision on the Hub (a branch, tag or commit of the repository)"
    if isinstance(err, errors.RepositoryNotFoundError):
        return f"{what}: no such {kind} on the Hub, or a private one (set HF_TOKEN to a token that can read it)"
    if isinstance(err, errors.LocalEntryNotFoundError):
        where = "HF_HUB_OFFLINE is set" if offline() else "the Hub could not be reached"
        fetch = "hf download ID" + (" --repo-type dataset" if kind == "dataset" else "")
        return (
            f"{what}: not in the Hugging Face cache ({cache_dir()}) and {where}: fetch it first where the Hub "
            f"is reachable (`{fetch}`), or point HF_HOME at a cache that holds it"
        )
    if isinstance(err, errors.EntryNotFoundError):
        return f"{what}: the repository has no config.json: not a transformers model"
    return f"{what}: the Hub failed ({type(err).__name__}: {err})"


def locate(model_id: str, commit: str | None = None) -> HubModel:
    """The commit ``model_id`` (``org/name[@revision]``) points to, found by fetching its config.json
    alone (``commit``, a pin, replaces the revision): a missing or gated repository fails here,
    before any weight is fetched. ``HubError`` names the id."""
    parsed = parse_id(model_id)
    if parsed is None:
        raise HubError(f"{model_id!r} is not a hub id (org/name or org/name@revision)")
    repo, revision = parsed
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        config = hf_hub_download(
            repo, "config.json", revision=commit or revision, cache_dir=cache_dir(), local_files_only=offline()
        )
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise HubError(describe_error(model_id, err)) from None
    snapshot = Path(str(config)).parent  # <cache>/models--org--name/snapshots/<commit>/config.json
    if not _COMMIT.match(snapshot.name):
        raise HubError(f"{model_id}: resolved to {snapshot.name!r}, not a commit")
    return HubModel(model_id, repo, revision or "main", snapshot.name, str(snapshot))


def fetch(model: HubModel) -> HubModel:
    """Fetch the pinned commit's config, tokenizer and safetensors files into the cache (nothing when
    they are there already)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        path = snapshot_download(
            model.repo,
            revision=model.commit,
            allow_patterns=MODEL_FILES,
            cache_dir=cache_dir(),
            local_files_only=offline(),
        )
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise HubError(describe_error(model.id, err)) from None
    return HubModel(model.id, model.repo, model.revision, model.commit, str(path))


def resolve(model_id: str, commit: str | None = None) -> HubModel:
    """``locate`` then ``fetch``: the snapshot of ``model_id`` on this machine, pinned."""
    return fetch(locate(model_id, commit))


def read_pins(run_dir: Path) -> dict[str, HubModel]:
    """The hub models a run in ``run_dir`` resolved before (none when it never got that far)."""
    path = run_dir / PINS_FILE
    if not path.is_file():
        return {}
    return {k: HubModel(**v) for k, v in json.loads(path.read_text()).get("models", {}).items()}


def write_pins(run_dir: Path, models: dict[str, HubModel]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / PINS_FILE
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["models"] = {**data.get("models", {}), **{k: asdict(v) for k, v in models.items()}}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def pin_models(cfg: CohortConfig, run_dir: Path) -> tuple[CohortConfig, dict[str, HubModel]]:
    """``cfg`` with every hub id among its members' models replaced by its pinned snapshot directory,
    and the pins (recorded in ``run_dir``). An id pinned there before resolves to the same commit.
    Every id is resolved before any is fetched in full, so a missing one fails first."""
    ids = sorted({m.model for m in cfg.served_members() if m.model and is_hub_id(m.model)})
    if not ids:
        return cfg, {}
    before = read_pins(run_dir)
    located: dict[str, HubModel] = {}
    for i in ids:
        try:
            located[i] = locate(i, before[i].commit if i in before else None)
        except HubError as err:
            raise HubError(f"{err} (and no local directory {i} exists)") from None
    write_pins(run_dir, located)  # recorded before the (long) fetch: a retry after a failed one keeps them
    pins = {i: fetch(m) for i, m in located.items()}
    members = [m.model_copy(update={"model": pins[m.model].path}) if m.model in pins else m for m in cfg.members]
    return cfg.model_copy(update={"members": members}), pins


def member_name(repo: str) -> str:
    """A member name (lowercase letters, digits, dashes; 40 at most) for a repository:
    ``HuggingFaceTB/SmolLM2-135M-Instruct`` -> ``smollm2-135m-instruct``."""
    name = re.sub(r"[^a-z0-9]+", "-", repo.split("/")[-1].lower()).strip("-")[:40].strip("-")
    return name or "member"
