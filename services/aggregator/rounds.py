"""The round driver: prompts -> G samples from every member -> peer rewards -> one graded batch per
trained member, appended to its Redis stream.

Rounds overlap training (the driver does not wait for a step to finish) but respect back-pressure:
a trained member whose stream holds ``rounds.max_pending_batches`` unconsumed batches gets no new
batch. With ``rounds.backpressure: wait`` (default) the next round waits until every trainer has
room, so all members train on the same rounds; with ``skip`` the full member misses the round (its
samples still vote for its peers). A member that fails is left out of the round; with fewer than
``rounds.min_quorum`` members answering, the round is retried later with the same prompts. All of
a round's writes are one atomic, idempotent commit (see store.py), after which the round counter,
prompt cursor, grader reliabilities and collapse baselines are durable in Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from dataclasses import dataclass, field

from pydantic_core import to_json

from corl.config import CohortConfig, MemberConfig
from corl.proto import BatchDiagnostics, GenerateRequest, GenerateResponse, RoundStats
from corl.rewards import (
    CollapseDetector,
    GraderReliability,
    agreement_matrix,
    compute_rewards,
    judge_rewards,
    peer_votes_reliability_update,
    pseudo_label,
)
from corl.tasks import get_task

from .grading_pool import GradingPool
from .judging import judge_round
from .members import MemberClient, MemberError
from .metrics import AggregatorMetrics
from .prompts import PromptSource
from .settings import AggregatorSettings
from .stats import member_diagnostics, member_round_stats
from .store import RoundState, RoundStore, batch_id

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


def graded_batch_json(
    run_id: str,
    round_: int,
    member: str,
    reward_mode: str,
    resp: GenerateResponse,
    rewards: list[list[float]],
    answers: list[list[str | None]],
    diag: BatchDiagnostics,
    now: float,
) -> bytes:
    """``GradedBatch.model_dump_json()`` of a member's batch, built from plain dicts.

    Every field comes from validated inputs, and a round builds N*B*G samples, so per-sample
    model construction would dominate the round's cost; the JSON is byte-for-byte what the
    model would dump (a test checks it round-trips through ``GradedBatch``).
    """
    bid = batch_id(run_id, round_, member)
    version = resp.weight_version
    samples = []
    for p, pr in enumerate(resp.results):
        gid = f"{bid}-p{p}"
        rw_p, ans_p, prompt, prompt_ids = rewards[p], answers[p], pr.prompt, pr.prompt_token_ids
        for s, smp in enumerate(pr.samples):
            samples.append(
                {
                    "sample_id": f"{gid}-s{s}",
                    "group_id": gid,
                    "prompt": prompt,
                    "prompt_token_ids": prompt_ids,
                    "response": smp.text,
                    "response_token_ids": smp.token_ids,
                    "logprobs": smp.logprobs,
                    "finish_reason": smp.finish_reason,
                    "weight_version": version,
                    "reward": float(rw_p[s]),
                    "answer": ans_p[s],
                }
            )
    batch = {
        "batch_id": bid,
        "run_id": run_id,
        "round": round_,
        "member": member,
        "reward_mode": reward_mode,
        "created_at": now,
        "samples": samples,
        "diagnostics": diag.model_dump(),
    }
    return to_json(batch)


class RoundDriver:
    def __init__(
        self,
        cfg: CohortConfig,
        settings: AggregatorSettings,
        store: RoundStore,
        client: MemberClient,
        source: PromptSource,
        metrics: AggregatorMetrics,
        pool: GradingPool | None = None,
    ):
        self.cfg, self.settings, self.store, self.client = cfg, settings, store, client
        self.source, self.metrics, self.pool = source, metrics, pool
        self.task = get_task(cfg.task)
        self.state = RoundState()
        self.reliability = GraderReliability.from_config(cfg.reward.reliability)
        self.collapse = CollapseDetector(cfg.reward.collapse_fraction)
        self._trained = [m.name for m in cfg.members if m.role == "trained"]
        self._order = [m.name for m in cfg.members]

    async def start(self) -> None:
        """Create the consumer groups and load the durable round state."""
        await self.store.ensure_groups(self._trained)
        await self._load()
        log.info(
            "run %s: continuing at round %d (prompt cursor %d)",
            self.cfg.run_id,
            self.state.next_round,
            self.state.cursor,
        )

    async def _load(self) -> None:
        self.state = await self.store.load()
        learnt = self.state.learnt
        if "reliability" in learnt:
            # Mutate in place: the grading pool holds this same object.
            restored = GraderReliability.from_snapshot(learnt["reliability"])
            self.reliability.__dict__.update(restored.__dict__)
        if "collapse" in learnt:
            self.collapse = CollapseDetector.from_snapshot(learnt["collapse"])
        for m in self._order:
            self.reliability.register(m)
        self.metrics.round.set(self.state.next_round)

    async def run_forever(self) -> None:
        max_rounds = self.cfg.rounds.max_rounds
        while max_rounds is None or self.state.next_round < max_rounds:
            try:
                res = await self.run_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("run %s: round %d failed; retrying", self.cfg.run_id, self.state.next_round)
                await asyncio.sleep(self.settings.quorum_retry_s)
                continue
            if res.status in ("backpressure", "no_prompts"):
                await asyncio.sleep(self.settings.backpressure_poll_s)
            elif res.status == "no_quorum":
                await asyncio.sleep(self.settings.quorum_retry_s)
        log.info("run %s: reached max_rounds=%s", self.cfg.run_id, max_rounds)

    async def _generate(self, member: MemberConfig, round_: int, prompts: list[str]) -> GenerateResponse | None:
        rc = self.cfg.rounds
        req = GenerateRequest(
            prompts=prompts,
            n=rc.samples_per_prompt,
            max_tokens=rc.max_tokens,
            temperature=rc.temperature,
            top_p=rc.top_p,
            seed=_seed(self.cfg.run_id, round_, member.name),
        )
        t0 = time.perf_counter()
        try:
            resp = await self.client.generate(member, req)
        except MemberError as err:
            self.metrics.member_failures.labels(member.name).inc()
            log.warning("round %d: member %s left out: %s", round_, member.name, err)
            return None
        self.metrics.generate_seconds.labels(member.name).observe(time.perf_counter() - t0)
        return resp

    async def run_round(self) -> RoundResult:
        cfg, rc, m = self.cfg, self.cfg.rounds, self.metrics
        r, cursor = self.state.next_round, self.state.cursor
        pending = await self.store.unconsumed(self._trained)
        for name, n in pending.items():
            m.unconsumed.labels(name).set(n)
        open_ = [name for name in self._trained if pending[name] < rc.max_pending_batches]
        # "wait": no member skips a round, so every trainer sees the same prompts (equal budgets);
        # "skip": a member whose trainer is behind misses rounds while the others go on.
        if not open_ or (rc.backpressure == "wait" and len(open_) < len(self._trained)):
            m.rounds.labels("backpressure").inc()
            return RoundResult(r, "backpressure")
        examples = await self.source.take(cursor, rc.prompts_per_round)
        if not examples:
            return RoundResult(r, "no_prompts")
        prompts = [e.prompt for e in examples]
        t0 = time.perf_counter()

        responses = await asyncio.gather(*(self._generate(mc, r, prompts) for mc in cfg.members))
        ok = {mc.name: resp for mc, resp in zip(cfg.members, responses, strict=True) if resp is not None}
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

        present = list(ok)
        texts = {name: [[s.text for s in pr.samples] for pr in resp.results] for name, resp in ok.items()}
        extract = self.task.extract_answer
        answers = {
            name: [[extract(prompt, t) for t in row] for prompt, row in zip(prompts, rows, strict=True)]
            for name, rows in texts.items()
        }
        rewards, labels, pseudo = await self._rewards(r, prompts, texts, answers, [e.answer for e in examples])

        targets = [name for name in open_ if name in ok]
        now = time.time()
        truth = [e.answer for e in examples]
        batches: dict[str, bytes] = {}
        member_stats = {}
        for name in present:
            tokens = sum(len(s.token_ids) for pr in ok[name].results for s in pr.samples)
            diag, rate = member_diagnostics(answers[name], rewards[name], labels[name], tokens)
            member_stats[name] = member_round_stats(diag, pseudo[name], truth, name in targets)
            alarm = self.collapse.update(name, rate)
            m.collapse.labels(name).set(int(alarm))
            m.mean_reward.labels(name).set(diag.mean_reward)
            m.label_rate.labels(name).set(diag.label_rate)
            m.distinct.labels(name).set(diag.distinct_answers)
            m.entropy.labels(name).set(diag.answer_entropy)
            m.response_tokens.labels(name).set(diag.mean_response_tokens)
            if member_stats[name].pseudo_label_accuracy is not None:
                m.label_accuracy.labels(name).set(member_stats[name].pseudo_label_accuracy)
            if name in targets:
                batches[name] = graded_batch_json(
                    cfg.run_id, r, name, cfg.reward.mode, ok[name], rewards[name], answers[name], diag, now
                )

        stats = RoundStats(
            round=r, created_at=now, members=member_stats, missing=missing, agreement=agreement_matrix(pseudo)
        )
        learnt = {"reliability": self.reliability.snapshot(), "collapse": self.collapse.snapshot()}
        new_cursor = cursor + len(examples)
        added = await self.store.commit(r, new_cursor, batches, stats.model_dump_json(), learnt)
        if added < 0:
            log.warning("round %d was already committed by another aggregator: reloading state", r)
            await self._load()
            m.rounds.labels("stale").inc()
            return RoundResult(r, "stale", missing=missing)
        self.state.next_round, self.state.cursor, self.state.learnt = r + 1, new_cursor, learnt
        self._publish_graders()
        n_samples = rc.samples_per_prompt * len(examples)
        for name in batches:
            m.batches.labels(name).inc()
            m.samples.labels(name).inc(n_samples)
        m.rounds.labels("ok").inc()
        m.round.set(r + 1)
        m.round_seconds.observe(time.perf_counter() - t0)
        log.info("round %d: batches for %s, left out %s", r, sorted(batches), missing)
        return RoundResult(r, "ok", written=sorted(batches), missing=missing, samples=n_samples * len(batches))

    async def _rewards(
        self,
        r: int,
        prompts: list[str],
        texts: dict[str, list[list[str]]],
        answers: dict[str, list[list[str | None]]],
        truth: list[str | None],
    ) -> tuple[dict[str, list[list[float]]], dict[str, list[str | None]], dict[str, list[str | None]]]:
        """(rewards, labels, pseudo-labels) of every present member. Dataset answers reach reward
        code only in the explicit ``ground_truth`` baseline."""
        rw = self.cfg.reward
        present = list(answers)
        if rw.mode != "peer_judge":
            out = compute_rewards(
                rw.mode,
                answers,
                members=present,
                threshold=rw.threshold,
                topology=rw.topology,
                order=self._order,
                reliability=self.reliability.effective_weights() if rw.mode == "peer_agreement" else None,
                dataset_answers=truth if rw.mode == "ground_truth" else None,
            )
            if len(present) >= 2:
                peer_votes_reliability_update(self.reliability, out.pseudo_labels)
            return out.rewards, out.labels, out.pseudo_labels
        grades = await judge_round(
            r, self.cfg, prompts, texts, self.client, self.pool, self.settings.grading, self.metrics
        )
        rewards = judge_rewards(grades, self.reliability.effective_weights(), rw.judge.combine, rw.judge.trim)
        self.reliability.update([g for a in present for row in grades[a] for g in row if len(g) >= 2])
        # A judged prompt counts as labelled when a peer graded at least one of its samples.
        labels: dict[str, list[str | None]] = {
            a: ["graded" if any(any(g != a for g in s) for s in row) else None for row in grades[a]] for a in present
        }
        pseudo = {a: [pseudo_label(s, rw.threshold) for s in answers[a]] for a in present}
        return rewards, labels, pseudo

    def _publish_graders(self) -> None:
        for g in list(self.reliability.weights)[: self.settings.grading.max_graders + len(self._order)]:
            self.metrics.grader_weight.labels(g).set(self.reliability.weight(g))
            self.metrics.quarantined.labels(g).set(int(g in self.reliability.quarantined))
