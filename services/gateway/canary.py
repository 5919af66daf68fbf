"""The canary controller: every ``gateway.canary.poll_s``, each canaried member's versions and the
evaluator's readings are read, and the rule of ``corl.harvest.canary`` is applied.

Versions come from the replicas' ``GET /v1/info`` (and every forwarded reply's ``X-Corl-Weight-Version``);
readings from the run's held-out hash, which the evaluator (``corl serve evaluator`` or ``corl run``'s
monitor) writes as it reads the member's first server: the one the trainer swaps. Readings are kept
per version, so the serving version's reading survives the trainer moving on. A promotion is
``POST /v1/weights`` of the candidate's published folder into the stable replicas (admin token);
a stable replica that refuses keeps the old version and the promotion is tried again next poll.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import RedisError

from corl import redis_keys as keys
from corl.config import CohortConfig
from corl.harvest.canary import Decision, decide, trained_share
from corl.heldout import read_readings
from corl.proto import InfoResponse, WeightUpdateRequest
from corl.services.background import stop_task
from corl.services.http import bearer_headers
from corl.weights_store import ADAPTER_CONFIG, recorded_digest

from .metrics import GatewayMetrics
from .upstreams import Replica, Routes, Upstream

log = logging.getLogger(__name__)


class MemberCanary:
    """One canaried member's state: the serving version, readings per version, versions rolled back."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.serving: int | None = None
        self.readings: dict[int, float] = {}
        self.rejected: set[int] = set()

    @property
    def trained(self) -> list[Replica]:
        return [r for r in self.upstream.replicas if not r.stable]

    @property
    def stable(self) -> list[Replica]:
        return [r for r in self.upstream.replicas if r.stable]


class CanaryController:
    def __init__(
        self,
        cfg: CohortConfig,
        routes: Routes,
        http: httpx.AsyncClient,
        redis: aioredis.Redis,
        metrics: GatewayMetrics,
        admin_token: str | None,
        info_timeout_s: float = 2.0,
    ) -> None:
        self.cfg, self.http, self.redis, self.metrics = cfg, http, redis, metrics
        self.policy = cfg.gateway.canary
        self.admin_headers = bearer_headers(admin_token)
        self.info_timeout_s = info_timeout_s
        self.members = {name: MemberCanary(routes.upstreams[name]) for name in self.policy.stable}
        for c in self.members.values():
            c.upstream.trained_share = 0.0  # until the first poll knows the versions: stable replicas only
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.members:
            self._task = asyncio.create_task(self._run(), name="corl-canary")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # never fatal: the next poll tries again
                log.exception("canary poll failed")
            await asyncio.sleep(self.policy.poll_s)

    async def _version(self, replica: Replica) -> None:
        try:
            resp = await self.http.get(replica.url.rstrip("/") + "/v1/info", timeout=self.info_timeout_s)
            resp.raise_for_status()
            replica.version = InfoResponse.model_validate_json(resp.content).weight_version
        except (httpx.HTTPError, ValidationError):
            pass  # a replica that does not answer keeps its last known version

    async def _readings(self) -> None:
        try:
            raw: Any = await self.redis.hgetall(keys.heldout_accuracy(self.cfg.run_id))
        except RedisError as err:
            log.warning("canary: readings not read (%s)", type(err).__name__)
            return
        for name, reading in read_readings(raw).items():
            if name in self.members:
                self.members[name].readings[reading.weight_version] = reading.accuracy

    async def step(self) -> dict[str, Decision]:
        """One poll: versions, readings, a decision per member, and the traffic shares that follow."""
        await asyncio.gather(*(self._version(r) for c in self.members.values() for r in c.upstream.replicas))
        await self._readings()
        return {name: await self._decide(name, c) for name, c in self.members.items()}

    async def _decide(self, name: str, c: MemberCanary) -> Decision:
        stable = [r.version for r in c.stable if r.version is not None]
        trained = [r.version for r in c.trained if r.version is not None]
        if not stable or not trained:
            return "wait"
        c.serving = min(stable)
        candidate = min(trained)
        decision = decide(c.readings, c.serving, candidate, self.policy.tolerance)
        if candidate in c.rejected:
            decision = "wait"
        elif decision == "promote" and await self._promote(name, c, candidate):
            c.serving = candidate
            log.info("canary: %s version %d promoted to all traffic", name, candidate)
        elif decision == "promote":
            decision = "wait"  # a stable replica refused: tried again next poll
        elif decision == "rollback":
            c.rejected.add(candidate)
            log.warning(
                "canary: %s version %d rolled back (held-out %.3f < serving version %d's %.3f - %.3f)",
                name, candidate, c.readings[candidate], c.serving, c.readings[c.serving], self.policy.tolerance,
            )  # fmt: skip
        if decision != "wait":
            self.metrics.canary_decisions.labels(name, decision).inc()
        share = trained_share(
            c.serving, candidate, frozenset(c.rejected), self.policy.share, len(c.trained), len(c.upstream.replicas)
        )
        c.upstream.trained_share = share
        self.metrics.serving_version.labels(name).set(c.serving)
        self.metrics.canary_version.labels(name).set(candidate if candidate > c.serving else 0)
        self.metrics.canary_share.labels(name).set(share if candidate > c.serving else 0.0)
        return decision

    async def _promote(self, name: str, c: MemberCanary, version: int) -> bool:
        folder = Path(self.cfg.weights_dir) / name / f"v{version:06d}"
        try:
            sha = await asyncio.to_thread(lambda: recorded_digest(folder, (folder / "SHA256").read_text().strip()))
        except OSError as err:
            log.warning("canary: %s version %d not in the weights store (%s)", name, version, err)
            return False
        fmt = "lora" if (folder / ADAPTER_CONFIG).is_file() else "full"
        body = WeightUpdateRequest(version=version, uri=str(folder), sha256=sha, format=fmt).model_dump_json()
        ok = True
        for r in c.stable:
            if r.version is not None and r.version >= version:
                continue
            try:
                resp = await self.http.post(
                    r.url.rstrip("/") + "/v1/weights",
                    content=body,
                    headers={"content-type": "application/json", **self.admin_headers},
                )
                resp.raise_for_status()
                r.version = version
            except httpx.HTTPError as err:
                log.warning("canary: stable replica of %s refused version %d: %s", name, version, type(err).__name__)
                ok = False
        return ok
