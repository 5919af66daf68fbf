"""The serving layer the routes call: one object per app, built in lifespan from the clients.

It owns the run's learnt state (``LearntState``) and hands the same object to the grading pool
and the round driver when it builds them; nothing is wired after construction.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import redis.asyncio as aioredis

from corl import proto
from corl.config import CohortConfig
from corl.harvest.stats import read_stats
from corl.heldout import read_readings
from corl.services.background import stop_task
from corl.services.errors import NotFoundError
from corl.tracking import Tracking

from .dashboard import build_view
from .endpoints import build_endpoint_clients
from .grading_pool import GradingPool
from .members import MemberClient
from .metrics import AggregatorMetrics
from .prompts import build_prompt_source, posted_source
from .reward_server import RewardServer
from .rounds import RoundDriver
from .settings import AggregatorSettings
from .state import LearntState
from .stats import run_stats
from .store import RoundStore

log = logging.getLogger(__name__)


class AggregatorServing:
    def __init__(
        self,
        cfg: CohortConfig,
        settings: AggregatorSettings,
        redis: aioredis.Redis,
        http: httpx.AsyncClient,
        metrics: AggregatorMetrics,
        tracking: Tracking | None = None,
    ):
        self.cfg, self.settings, self.metrics = cfg, settings, metrics
        self.state = LearntState(cfg.reward, [m.name for m in cfg.members])
        self.store = RoundStore(
            redis,
            cfg.run_id,
            stream_maxlen=settings.stream_maxlen,
            stats_maxlen=settings.stats_maxlen,
            marker_ttl_s=settings.marker_ttl_s,
        )
        self.source = build_prompt_source(cfg, redis)
        self.pool = GradingPool(
            redis,
            cfg.run_id,
            settings.grading,
            metrics,
            self.state.reliability,
            reserved={m.name for m in cfg.members},
        )
        # Outside endpoint members: each its own bounds and key (a missing key variable stops the start here).
        self.endpoints = build_endpoint_clients(cfg, http, settings.http, metrics)
        token = settings.cohort_token.get_secret_value() if settings.cohort_token else None
        self.client = MemberClient(http, settings.http, cfg.rounds.request_timeout_s, self.endpoints, token)
        self.driver = RoundDriver(
            cfg, settings, self.store, self.client, self.source, metrics, self.state, self.pool, tracking
        )
        self.rewards = RewardServer(cfg, settings.reward_server, self.client, metrics, self.state.weights)
        self._task: asyncio.Task[None] | None = None

    async def start(self, run_rounds: bool) -> None:
        await self.driver.start()
        for name in await self.pool.names():
            self.state.reliability.register(name, probation=True)
        if run_rounds:
            self._task = asyncio.create_task(self.driver.run_forever(), name="corl-round-driver")

    def halt_rounds(self) -> None:
        """Start no more rounds (safe from a signal handler): a stopping aggregator drains its open
        requests before its shutdown, and must not produce rounds meanwhile. A round cut short is not
        committed; the run's next start produces it again. The flag holds where the cancel is lost on
        its way (seen in about one test run in three: the driver went on for 20 rounds): the loop checks
        it before every round."""
        self.driver.halted = True
        if self._task is not None and not self._task.done():
            self._task.get_loop().call_soon_threadsafe(self._task.cancel)

    async def stop(self) -> None:
        await self.rewards.stop()
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    def _check_run(self, run: str) -> None:
        if run != self.cfg.run_id:
            raise NotFoundError(f"no run {run!r}; this aggregator drives {self.cfg.run_id!r}")

    async def stats(self, run: str, last: int | None = None) -> proto.RunStats:
        self._check_run(run)
        rounds = await self.store.recent_stats(min(last or self.settings.stats_rounds, self.settings.stats_rounds))
        heldout = read_readings(await self.store.heldout())
        harvest = read_stats(*await self.store.harvest()) if self.source.kind == "harvest" else None
        transfers = await self.store.weight_transfers([m.name for m in self.cfg.members if m.role == "trained"])
        return run_stats(
            self.cfg.run_id,
            self.driver.round_state.next_round,
            rounds,
            self.state.reliability,
            self.state.collapse.tripped,
            {name: c.stats() for name, c in self.endpoints.items()},
            {m.name: heldout[m.name] for m in self.cfg.served_members() if m.name in heldout},
            harvest,
            transfers,
        )

    async def dashboard(self, run: str, last: int | None = None) -> proto.DashboardView:
        stats = await self.stats(run, last)
        timeout = self.settings.member_info_timeout_s
        infos = await asyncio.gather(*(self.client.info(m, timeout) for m in self.cfg.members))
        versions = {m.name: (i.weight_version if i else None) for m, i in zip(self.cfg.members, infos, strict=True)}
        backlog = await self.store.unconsumed([m.name for m in self.cfg.members if m.role == "trained"])
        return build_view(self.cfg, stats, versions, backlog)

    async def openrlhf_reward(self, body: proto.OpenRLHFRewardRequest) -> proto.OpenRLHFRewardResponse:
        return await self.rewards.openrlhf(body)

    async def slime_reward(self, body: proto.SlimeRewardRequest) -> proto.SlimeRewardResponse:
        return await self.rewards.slime(body)

    async def post_prompts(self, body: proto.PromptsPost) -> proto.PromptsAccepted:
        total = await posted_source(self.source).post(body.prompts)
        return proto.PromptsAccepted(accepted=len(body.prompts), queued=max(0, total - self.driver.round_state.cursor))

    async def register_grader(self, body: proto.GraderRegistration) -> proto.GraderRegistered:
        reg = await self.pool.register(body)
        log.info("grader %s registered (%s mode, probation)", reg.name, reg.mode)
        return reg

    async def authenticate_grader(self, token: str) -> str:
        return await self.pool.authenticate(token)

    async def grading_tasks(self, grader: str, max_tasks: int, wait_s: float) -> proto.GradingTasks:
        return proto.GradingTasks(tasks=await self.pool.lease(grader, max_tasks, wait_s))

    async def grading_results(self, grader: str, body: proto.GradingResults) -> proto.GradingResultsAccepted:
        return await self.pool.submit(grader, body)
