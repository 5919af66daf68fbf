"""The round driver: prompts -> G samples from every member -> ``grade_round`` -> one graded batch per
trained member, appended to its Redis stream.

Rounds overlap training (the driver does not wait for a step to finish) but respect back-pressure:
a trained member whose stream holds ``rounds.max_pending_batches`` undelivered batches gets no new
batch. With ``rounds.backpressure: wait`` (default) the next round waits until every trainer has
room, so all members train on the same rounds; with ``skip`` the full member misses the round (its
samples still vote for its peers). A member that fails is left out of the round; with fewer than
``rounds.min_quorum`` members answering, the round is retried later with the same prompts. All of
a round's writes are one atomic, idempotent commit (see store.py), after which the round counter,
prompt cursor and learnt state are durable in Redis. The grading itself is pure
(``corl.rewards.grade_round``) and runs in a worker thread: a task may run programs to read answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from dataclasses import dataclass, field

from corl.config import CohortConfig, MemberConfig
from corl.proto import GenerateRequest, GenerateResponse
from corl.rewards import REWARD_MODES, RoundOutcome, grade_round
from corl.tasks import Example, get_task
from corl.tracking import Tracking

from .batches import graded_batch_json
from .grading_pool import GradingPool
from .judging import judge_round
from .members import MemberClient, MemberError
from .metrics import AggregatorMetrics
from .prompts import HARVEST_ID, PromptSource
from .settings import AggregatorSettings
from .state import LearntState
from .stats import round_records, round_stats
from .store import RoundState, RoundStore

log = logging.getLogger(__name__)


@dataclass
class RoundResult:
    round: int
    status: str  # ok | backpressure | no_prompts | no_quorum | stale
    written: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    samples: int = 0


def _seed(run: str, round_: int, member: str) -> int:
    # Reproducible sampling per (run, round, member): a retried round asks for the same draws.
    return zlib.crc32(f"{run}:{round_}:{member}".encode()) & 0x7FFFFFFF


class RoundDriver:
    def __init__(
        self,
        cfg: CohortConfig,
        settings: AggregatorSettings,
        store: RoundStore,
        client: MemberClient,
        source: PromptSource,
        metrics: AggregatorMetrics,
        state: LearntState,
        pool: GradingPool | None = None,
        tracking: Tracking | None = None,
    ):
        self.cfg, self.settings, self.store, self.client = cfg, settings, store, client
        self.source, self.metrics, self.state, self.pool = source, metrics, state, pool
        self.tracking = tracking or Tracking()
        self.task = get_task(cfg.task.name)
        self.sampling = cfg.sampling()
        self.mode = REWARD_MODES[cfg.reward.mode]
        self.round_state = RoundState()
        self.halted = False  # set by a stop signal: no round starts after it, even if a cancel is lost
        self._trained = [m.name for m in cfg.members if m.role == "trained"]
        self._order = [m.name for m in cfg.members]

    async def start(self) -> None:
        """Create the consumer groups and load the durable round state."""
        await self.store.ensure_groups(self._trained)
        await self._load()
        log.info(
            "run %s: continuing at round %d (prompt cursor %d)",
            self.cfg.run_id,
            self.round_state.next_round,
            self.round_state.cursor,
        )

    async def _load(self) -> None:
        self.round_state = await self.store.load()
        self.state.restore(self.round_state.learnt)
        self.metrics.round.set(self.round_state.next_round)

    async def run_forever(self) -> None:
        max_rounds = self.cfg.rounds.max_rounds
        while not self.halted and (max_rounds is None or self.round_state.next_round < max_rounds):
            try:
                res = await self.run_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("run %s: round %d failed; retrying", self.cfg.run_id, self.round_state.next_round)
                await asyncio.sleep(self.settings.quorum_retry_s)
                continue
            if res.status in ("backpressure", "no_prompts"):
                await asyncio.sleep(self.settings.backpressure_poll_s)
            elif res.status == "no_quorum":
                await asyncio.sleep(self.settings.quorum_retry_s)
        if self.halted:
            log.info("run %s: rounds halted at round %d", self.cfg.run_id, self.round_state.next_round)
        else:
            log.info("run %s: reached max_rounds=%s", self.cfg.run_id, max_rounds)

    async def _open_members(self) -> list[str] | None:
        """Trained members with room in their stream; None when the round must wait."""
        rc = self.cfg.rounds
        pending = await self.store.unconsumed(self._trained)
        for name, n in pending.items():
            self.metrics.unconsumed.labels(name).set(n)
        open_ = [name for name in self._trained if pending[name] < rc.max_pending_batches]
        # "wait": no member skips a round, so every trainer sees the same prompts (equal budgets);
        # "skip": a member whose trainer is behind misses rounds while the others go on.
        if not open_ or (rc.backpressure == "wait" and len(open_) < len(self._trained)):
            return None
        return open_

    async def _generate(
        self, member: MemberConfig, round_: int, prompts: list[str]
    ) -> tuple[GenerateResponse, GenerateResponse | None] | None:
        """The member's G samples of ``prompts``, and its vote-only samples when ``reward.votes``
        asks for them; None when it failed (it is left out of the round)."""
        n_votes = self.cfg.reward.vote_samples()
        reqs = [(self.sampling, self.cfg.rounds.samples_per_prompt, member.name)]
        if n_votes:
            vote_sampling = self.sampling.model_copy(update={"temperature": self.cfg.reward.votes.temperature})
            reqs.append((vote_sampling, n_votes, f"{member.name}:votes"))
        t0 = time.perf_counter()
        try:
            resps = [
                await self.client.generate(
                    member,
                    GenerateRequest.of(
                        prompts, sp, n=n, seed=_seed(self.cfg.run_id, round_, key), format=self.task.prompt_format
                    ),
                )
                for sp, n, key in reqs
            ]
        except MemberError as err:
            self.metrics.member_failures.labels(member.name).inc()
            log.warning("round %d: member %s left out: %s", round_, member.name, err)
            return None
        self.metrics.generate_seconds.labels(member.name).observe(time.perf_counter() - t0)
        return resps[0], resps[1] if n_votes else None

    async def _grade(
        self,
        r: int,
        ok: dict[str, GenerateResponse],
        examples: list[Example],
        votes: dict[str, GenerateResponse] | None,
    ) -> RoundOutcome:
        grades = None
        if self.mode.judged:
            grades = await judge_round(
                r, self.cfg, self.task, ok, self.client, self.pool, self.settings.grading, self.metrics
            )
        rel = self.state.reliability
        return await asyncio.to_thread(
            grade_round,
            ok,
            self.task,
            self.cfg.reward,
            rel.effective_weights(),
            learnt_weights=dict(rel.weights),
            order=self._order,
            teachers=self.cfg.teachers(),
            dataset_answers=[e.answer for e in examples],
            grades=grades,
            votes=votes,
            seed=_seed(self.cfg.run_id, r, "reward"),
        )

    async def run_round(self) -> RoundResult:
        cfg, rc, m = self.cfg, self.cfg.rounds, self.metrics
        r, cursor = self.round_state.next_round, self.round_state.cursor
        open_ = await self._open_members()
        if open_ is None:
            m.rounds.labels("backpressure").inc()
            return RoundResult(r, "backpressure")
        examples = await self.source.take(cursor, rc.prompts_per_round)
        if not examples:
            return RoundResult(r, "no_prompts")
        prompts = [e.prompt for e in examples]
        t0 = time.perf_counter()

        responses = await asyncio.gather(*(self._generate(mc, r, prompts) for mc in cfg.members))
        answered = {mc.name: resp for mc, resp in zip(cfg.members, responses, strict=True) if resp is not None}
        ok = {name: resp for name, (resp, _) in answered.items()}
        votes = {name: v for name, (_, v) in answered.items() if v is not None} if cfg.reward.vote_samples() else None
        missing = [name for name in self._order if name not in ok]
        if len(ok) < rc.min_quorum:
            m.rounds.labels("no_quorum").inc()
            log.warning(
                "round %d: only %d of %d members answered (quorum %d): retrying later",
                r,
                len(ok),
                len(cfg.members),
                rc.min_quorum,
            )
            return RoundResult(r, "no_quorum", missing=missing)

        outcome = await self._grade(r, ok, examples, votes)
        alarms = self.state.observe(outcome)
        held = self.state.held()
        targets = [name for name in open_ if name in ok and name not in held]
        now = time.time()
        batches = {
            name: graded_batch_json(
                cfg.run_id, r, name, cfg.reward.mode, self.sampling, ok[name], outcome.members[name], now
            )
            for name in targets
        }
        harvested = [str(e.meta[HARVEST_ID]) for e in examples if HARVEST_ID in e.meta]
        stats = round_stats(r, now, outcome, missing, batches, harvested)
        new_cursor = self.source.next_cursor(cursor, examples)
        added = await self.store.commit(r, new_cursor, batches, stats.model_dump_json(), self.state.snapshot())
        if added < 0:
            log.warning("round %d was already committed by another aggregator: reloading state", r)
            await self._load()
            m.rounds.labels("stale").inc()
            return RoundResult(r, "stale", missing=missing)
        self.round_state.next_round, self.round_state.cursor = r + 1, new_cursor
        m.observe(outcome, alarms)
        m.observe_graders(self.state.reliability, self.settings.grading.max_graders + len(self._order))
        n_samples = rc.samples_per_prompt * len(examples)
        for name in batches:
            m.batches.labels(name).inc()
            m.samples.labels(name).inc(n_samples)
        if harvested and batches:
            m.harvest_trained.inc(len(harvested))
            await self.store.count_trained(len(harvested))
        m.rounds.labels("ok").inc()
        m.round.set(r + 1)
        m.round_seconds.observe(time.perf_counter() - t0)
        self.tracking.log(*round_records(stats, alarms))
        log.info("round %d: batches for %s, left out %s", r, sorted(batches), missing)
        return RoundResult(r, "ok", written=sorted(batches), missing=missing, samples=n_samples * len(batches))
