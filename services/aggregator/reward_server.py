"""The cohort as a reward server for outside trainers (OpenRLHF ``/get_reward``, slime ``remote_rm``).

Label-free by default: every member samples G answers to the prompt through its ``/v1/generate``
(as a round does), and a response is scored by its agreement with the cohort's consensus answer
(``corl.rewards.consensus``). Group-aware: the G responses an outside trainer sends for one prompt
share one round of member sampling. Samples are cached by prompt (bounded, with a TTL because the
members' weights move on), and a prompt already being sampled for another request is awaited, not
sampled twice. Member sampling runs as its own task, so a request that times out does not cancel
the sampling other requests share; at most ``max_concurrency`` sampling calls run at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from corl.config import CohortConfig, MemberConfig
from corl.proto import (
    GenerateRequest,
    GenerateResponse,
    GradeItem,
    GradeRequest,
    OpenRLHFRewardRequest,
    OpenRLHFRewardResponse,
    SlimeRewardRequest,
    SlimeRewardResponse,
)
from corl.proto.reward_server import Label
from corl.rewards import combine_grades
from corl.rewards.consensus import (
    Consensus,
    agreement_scores,
    cohort_consensus,
    consensus_rewards,
    label_rewards,
    split_query,
    strip_end_markers,
)
from corl.services.errors import InvalidInputError, UnavailableError
from corl.tasks import extract_all, get_task

from .members import MemberClient, MemberError
from .metrics import AggregatorMetrics
from .settings import RewardServerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptVotes:
    """The members' samples of one prompt, read as answers, and their consensus."""

    answers: dict[str, list[str | None]]
    versions: dict[str, int]
    consensus: Consensus
    at: float


@dataclass(frozen=True)
class Scored:
    rewards: list[float]
    scores: list[float]
    answers: list[str | None]
    consensus: list[str | None]
    versions: dict[str, int]


class RewardServer:
    def __init__(
        self,
        cfg: CohortConfig,
        settings: RewardServerSettings,
        client: MemberClient,
        metrics: AggregatorMetrics,
        weights: Callable[[], Mapping[str, float]],
    ) -> None:
        self.cfg, self.settings, self.client, self.metrics, self.weights = cfg, settings, client, metrics, weights
        self.task = get_task(cfg.task.name)
        self.sampling = cfg.sampling()
        self.n = settings.samples_per_prompt or cfg.rounds.samples_per_prompt
        self.quorum = min(cfg.rounds.min_quorum, len(cfg.members))
        self._cache: OrderedDict[str, PromptVotes] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[PromptVotes]] = {}
        self._sem = asyncio.Semaphore(settings.max_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- the two protocols ------------------------------------------------------------------------

    async def openrlhf(self, req: OpenRLHFRewardRequest) -> OpenRLHFRewardResponse:
        markers = self.settings.end_markers
        responses = [split_query(q, p, markers) for q, p in zip(req.query, req.prompts, strict=True)]
        s = await self.score(req.prompts, responses, req.labels)
        labelled = [0.0 if c is None else 1.0 for c in s.consensus]
        return OpenRLHFRewardResponse(
            rewards=s.rewards,
            scores=s.scores,
            extra_logs={
                "cohort_agreement": s.scores,
                "cohort_labelled": labelled,
                "answer_parsed": [0.0 if a is None else 1.0 for a in s.answers],
            },
            weight_versions=s.versions,
        )

    async def slime(self, req: SlimeRewardRequest) -> SlimeRewardResponse:
        response = strip_end_markers(req.response, self.settings.end_markers)
        s = await self.score([req.task_text()], [response], [req.label])
        return SlimeRewardResponse(
            reward=s.rewards[0],
            score=min(1.0, max(0.0, s.scores[0])),
            answer=s.answers[0],
            consensus=s.consensus[0],
            weight_versions=s.versions,
        )

    # --- scoring --------------------------------------------------------------------------------

    async def score(self, prompts: Sequence[str], responses: Sequence[str], labels: Sequence[Label] | None) -> Scored:
        if len(prompts) > self.settings.max_queries:
            raise InvalidInputError(
                f"{len(prompts)} responses exceed this server's bound {self.settings.max_queries}", field="query"
            )
        if any(not p.strip() for p in prompts):
            raise InvalidInputError("every prompt must be non-empty", field="prompts")
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                return await self._score(list(prompts), list(responses), labels)
        except TimeoutError:
            raise UnavailableError(
                f"the cohort did not score {len(prompts)} responses within {self.settings.timeout_s}s"
            ) from None

    async def _score(self, prompts: list[str], responses: list[str], labels: Sequence[Label] | None) -> Scored:
        mode = self.settings.mode
        answers = await asyncio.to_thread(extract_all, self.task, list(zip(prompts, responses, strict=True)))
        if mode == "ground_truth":
            if labels is None or any(lab is None for lab in labels):
                raise InvalidInputError("ground_truth mode needs a label for every response", field="labels")
            truth = await asyncio.to_thread(
                extract_all, self.task, [(p, str(lab)) for p, lab in zip(prompts, labels, strict=True)]
            )
            rewards = label_rewards(answers, truth)
            return Scored(rewards, rewards, answers, [None] * len(prompts), {})  # the cohort was not asked
        if mode == "judge":
            judged, judges = await self._judge(prompts, responses)
            return Scored(judged, judged, answers, [None] * len(prompts), judges)
        votes = await self.votes(prompts)
        per = [votes[p] for p in prompts]
        agree = [agreement_scores(v.consensus, [a])[0] for v, a in zip(per, answers, strict=True)]
        if mode == "agreement":
            rewards = agree
        else:
            rewards = [consensus_rewards(v.consensus, [a])[0] for v, a in zip(per, answers, strict=True)]
        versions: dict[str, int] = {}
        for v in per:
            for m, ver in v.versions.items():
                versions[m] = max(ver, versions.get(m, ver))
        return Scored(rewards, agree, answers, [v.consensus.answer for v in per], versions)

    # --- member sampling, shared by prompt ----------------------------------------------------

    def _cached(self, prompt: str, now: float) -> PromptVotes | None:
        hit = self._cache.get(prompt)
        if hit is None:
            return None
        if now - hit.at > self.settings.cache_ttl_s:
            del self._cache[prompt]
            return None
        self._cache.move_to_end(prompt)
        return hit

    async def votes(self, prompts: Sequence[str]) -> dict[str, PromptVotes]:
        """Member samples of every distinct prompt: from the cache, from a sampling already in
        flight, or from new sampling calls (``max_prompts_per_call`` prompts each)."""
        now = time.monotonic()
        out: dict[str, PromptVotes] = {}
        waits: dict[str, asyncio.Future[PromptVotes]] = {}
        new: list[str] = []
        for p in dict.fromkeys(prompts):
            if (hit := self._cached(p, now)) is not None:
                out[p] = hit
                self.metrics.reward_cache.labels("hit").inc()
            elif p in self._inflight:
                waits[p] = self._inflight[p]
                self.metrics.reward_cache.labels("shared").inc()
            else:
                new.append(p)
                self.metrics.reward_cache.labels("miss").inc()
        loop = asyncio.get_running_loop()
        for p in new:
            fut: asyncio.Future[PromptVotes] = loop.create_future()
            fut.add_done_callback(_retrieve)
            self._inflight[p] = waits[p] = fut
        step = self.settings.max_prompts_per_call
        for i in range(0, len(new), step):
            task = asyncio.create_task(self._sample(new[i : i + step]), name="corl-reward-sampling")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for p, f in waits.items():
            out[p] = await asyncio.shield(f)
        return out

    async def _generate(self, member: MemberConfig, prompts: list[str]) -> GenerateResponse | None:
        seed = zlib.crc32(f"{member.name}:{prompts}".encode()) & 0x7FFFFFFF
        req = GenerateRequest.of(prompts, self.sampling, n=self.n, seed=seed, format=self.task.prompt_format)
        try:
            return await self.client.generate(member, req)
        except MemberError as err:
            self.metrics.member_failures.labels(member.name).inc()
            log.warning("reward server: member %s left out: %s", member.name, err)
            return None

    async def _sample(self, prompts: list[str]) -> None:
        try:
            async with self._sem:
                got = await asyncio.gather(*(self._generate(m, prompts) for m in self.cfg.members))
            ok = {m.name: r for m, r in zip(self.cfg.members, got, strict=True) if r is not None}
            if len(ok) < self.quorum:
                n = len(self.cfg.members)
                raise UnavailableError(f"only {len(ok)} of {n} members answered (quorum {self.quorum})")
            pairs = [
                (p, s.text) for r in ok.values() for p, res in zip(prompts, r.results, strict=True) for s in res.samples
            ]
            flat = iter(await asyncio.to_thread(extract_all, self.task, pairs))
            per_member = {name: [[next(flat) for _ in res.samples] for res in r.results] for name, r in ok.items()}
            weights = self.weights()
            versions = {name: r.weight_version for name, r in ok.items()}
            now = time.monotonic()
            for i, p in enumerate(prompts):
                answers = {name: a[i] for name, a in per_member.items()}
                cons = cohort_consensus(answers, threshold=self.cfg.reward.threshold, weights=weights)
                votes = PromptVotes(answers, versions, cons, now)
                self._cache[p] = votes
                self._cache.move_to_end(p)
                while len(self._cache) > self.settings.cache_size:
                    self._cache.popitem(last=False)
                if (f := self._inflight.get(p)) is not None and not f.done():
                    f.set_result(votes)
        except Exception as err:
            for p in prompts:
                if (f := self._inflight.get(p)) is not None and not f.done():
                    f.set_exception(err)
        finally:
            for p in prompts:
                f = self._inflight.get(p)
                if f is not None and not f.done():
                    f.set_exception(UnavailableError("sampling was cancelled"))
                self._inflight.pop(p, None)

    # --- judge mode -----------------------------------------------------------------------------

    async def _judge(self, prompts: list[str], responses: list[str]) -> tuple[list[float], dict[str, int]]:
        """Every member grades every response in judge mode; reliability-weighted combination."""
        items = [GradeItem(prompt=p, response=r) for p, r in zip(prompts, responses, strict=True)]
        step = self.settings.max_prompts_per_call
        chunks = [items[i : i + step] for i in range(0, len(items), step)]
        scores: dict[str, list[float | None]] = {}
        versions: dict[str, int] = {}
        for m in self.cfg.members:
            try:
                async with self._sem:
                    got = [await self.client.judge(m, self._grade_request(c)) for c in chunks]
            except MemberError as err:
                self.metrics.member_failures.labels(m.name).inc()
                log.warning("reward server: judge %s left out: %s", m.name, err)
                continue
            scores[m.name] = [s for g in got for s in g.scores]
            versions[m.name] = max(g.weight_version for g in got)
        if len(scores) < self.quorum:
            raise UnavailableError(f"only {len(scores)} of {len(self.cfg.members)} members graded")
        weights, jc = self.weights(), self.cfg.reward.judge
        combined = [
            combine_grades({g: v for g, s in scores.items() if (v := s[i]) is not None}, weights, jc.combine, jc.trim)
            for i in range(len(items))
        ]
        return [0.0 if c is None else c for c in combined], versions

    def _grade_request(self, items: list[GradeItem]) -> GradeRequest:
        return GradeRequest(
            items=items, task=self.task.name, mode="judge", format=self.task.prompt_format, rubric=self.cfg.task.rubric
        )


def _retrieve(f: asyncio.Future[PromptVotes]) -> None:
    # A sampling error whose requests all timed out is still "retrieved": no warning at exit.
    if not f.cancelled():
        f.exception()
