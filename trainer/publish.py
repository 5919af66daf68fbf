"""Publishing weights: a new versioned folder in the weights store, then a hot-swap on every replica.

Store layout: ``<weights_dir>/<member>/v000007/`` in save_pretrained layout (safetensors; for LoRA
only ``adapter_model.safetensors`` + ``adapter_config.json``) plus a ``SHA256`` file holding
``corl.weights_store.digest`` of the folder and an ``XXH3`` file with its ``fast_digest`` (what the
servers check: the same bytes, sixteen times faster). A folder appears by atomic rename, complete or not at
all. Pushing is ``POST /v1/weights`` with the admin token, retried with exponential backoff and
jitter on connection errors and 5xx; a replica that stays unreachable is remembered as behind and
brought up to the newest version by ``sync`` once it answers again.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from corl.proto import InfoResponse, WeightFormat, WeightUpdateRequest
from corl.weights_store import digest, fast_digest, recorded_digest

log = logging.getLogger(__name__)

PushOutcome = Literal["ok", "already_newer", "rejected", "unreachable"]


@dataclass(frozen=True)
class Published:
    version: int
    path: Path
    sha256: str
    format: WeightFormat
    xxh3: str | None = None  # absent from versions written before the XXH3 file

    def request(self) -> WeightUpdateRequest:
        return WeightUpdateRequest(
            version=self.version, uri=str(self.path), sha256=self.sha256, xxh3_128=self.xxh3, format=self.format
        )


class WeightsStore:
    """The member's folder of published versions; keeps the newest ``keep``."""

    def __init__(self, root: str | Path, member: str, keep: int = 3):
        self.dir = Path(root) / member
        self.keep = keep
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, version: int) -> Path:
        """Where ``version`` is (or will be) stored."""
        return self.dir / f"v{version:06d}"

    def versions(self) -> list[int]:
        out = []
        for p in self.dir.glob("v*"):
            if p.is_dir() and p.name[1:].isdigit() and (p / "SHA256").exists():
                out.append(int(p.name[1:]))
        return sorted(out)

    def latest_version(self) -> int:
        v = self.versions()
        return v[-1] if v else 0

    def get(self, version: int, fmt: WeightFormat) -> Published:
        path = self.path(version)
        sha = recorded_digest(path, (path / "SHA256").read_text().strip())
        xxh3 = (path / "XXH3").read_text().strip() if (path / "XXH3").is_file() else None
        return Published(version, path, sha, fmt, xxh3)

    def save(self, model, tokenizer, version: int, fmt: WeightFormat, state_dict=None) -> Published:  # type: ignore[no-untyped-def]
        """Write ``model`` (a PreTrainedModel or PeftModel) as ``version``; atomic. ``state_dict``: its
        weights gathered whole (a sharded model's own tensors are only this rank's shards)."""
        final = self.path(version)
        if final.exists():
            raise FileExistsError(f"weight version {version} already exists in {self.dir}: versions are never reused")
        tmp = self.dir / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if fmt == "full" and tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        sha, xxh3 = digest(tmp), fast_digest(tmp)
        (tmp / "SHA256").write_text(sha + "\n")
        (tmp / "XXH3").write_text(xxh3 + "\n")
        _fsync_tree(tmp)
        os.rename(tmp, final)
        _fsync_dir(self.dir)
        self._prune()
        return Published(version, final, sha, fmt, xxh3)

    def _prune(self) -> None:
        for v in self.versions()[: -self.keep]:
            shutil.rmtree(self.path(v), ignore_errors=True)


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Retryable(Exception):
    pass


def _retryable(err: BaseException) -> bool:
    return isinstance(err, httpx.TransportError | _Retryable)


class ReplicaPusher:
    """Pushes published versions to a member's server replicas and tracks which are behind."""

    def __init__(
        self,
        servers: list[str],
        admin_token: str | None,
        client: httpx.Client,
        attempts: int = 4,
        max_wait_s: float = 2.0,
    ):
        self.servers = [s.rstrip("/") for s in servers]
        self.client = client
        self.headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.attempts, self.max_wait_s = attempts, max_wait_s
        self.behind: set[str] = set()

    def _retrying(self, attempts: int) -> Retrying:
        return Retrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential_jitter(multiplier=0.1, max=self.max_wait_s, jitter=0.1),
            retry=retry_if_exception(_retryable),
            reraise=True,
        )

    def push_one(self, url: str, pub: Published, attempts: int | None = None) -> PushOutcome:
        body = pub.request().model_dump()
        try:
            for attempt in self._retrying(attempts or self.attempts):
                with attempt:
                    resp = self.client.post(f"{url}/v1/weights", json=body, headers=self.headers)
                    if resp.status_code >= 500:
                        raise _Retryable(f"{resp.status_code}: {resp.text[:200]}")
        except (httpx.TransportError, _Retryable) as err:
            log.warning("replica %s unreachable for version %d: %s", url, pub.version, err)
            self.behind.add(url)
            return "unreachable"
        if resp.status_code == 200:
            self.behind.discard(url)
            log.info("replica %s now serves version %d", url, pub.version)
            return "ok"
        if resp.status_code == 409:
            self.behind.discard(url)
            log.info("replica %s already has version >= %d", url, pub.version)
            return "already_newer"
        log.error("replica %s rejected version %d: %d %s", url, pub.version, resp.status_code, resp.text[:300])
        self.behind.add(url)
        return "rejected"

    def push(self, pub: Published) -> dict[str, PushOutcome]:
        # A replica already known to be down gets one try, so a dead replica does not slow every publish.
        return {u: self.push_one(u, pub, attempts=1 if u in self.behind else None) for u in self.servers}

    def served_version(self, url: str) -> int | None:
        try:
            resp = self.client.get(f"{url}/v1/info")
            resp.raise_for_status()
            return InfoResponse.model_validate(resp.json()).weight_version
        except (httpx.HTTPError, ValueError):
            return None

    def sync(self, pub: Published, only_behind: bool = False) -> dict[str, PushOutcome]:
        """Bring every replica (or those known to be behind) serving an older version up to ``pub``."""
        out: dict[str, PushOutcome] = {}
        for url in sorted(self.behind) if only_behind else self.servers:
            served = self.served_version(url)
            if served is None:
                self.behind.add(url)
                out[url] = "unreachable"
            elif served < pub.version:
                out[url] = self.push_one(url, pub, attempts=1)
            else:
                self.behind.discard(url)
        return out
