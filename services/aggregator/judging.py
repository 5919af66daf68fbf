"""``peer_judge`` grading fan-out: each response goes to k peers (never its author) through their
``/v1/grade`` judge mode (an outside endpoint member judges through its OpenAI API), and to the
pool's external graders (push: their ``/v1/grade`` under an overall timeout; pull: leased tasks
collected until a deadline). A grader that fails or is slow only loses its say in this round; it
never stalls it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from corl.config import CohortConfig
from corl.proto import GenerateResponse, GradeItem, GradeRequest
from corl.tasks import Task

from .grading_pool import Grader, GradingPool
from .members import MemberClient, MemberError
from .metrics import AggregatorMetrics
from .settings import GradingSettings

log = logging.getLogger(__name__)

Ref = tuple[str, int, int]  # (author, prompt, sample)
Grades = dict[str, list[list[dict[str, float]]]]  # author -> [prompt][sample] -> {grader: score}


def peer_graders(author: str, present: Sequence[str], k: int) -> list[str]:
    """The k members after ``author`` in ring order among those present (never the author)."""
    i = present.index(author)
    ring = [present[(i + j) % len(present)] for j in range(1, len(present))]
    return ring[:k]


async def judge_round(
    round_: int,
    cfg: CohortConfig,
    task: Task,
    responses: dict[str, GenerateResponse],
    client: MemberClient,
    pool: GradingPool | None,
    settings: GradingSettings,
    metrics: AggregatorMetrics,
) -> Grades:
    present = list(responses)
    prompts = [pr.prompt for pr in next(iter(responses.values())).results]
    texts = {a: [[s.text for s in pr.samples] for pr in resp.results] for a, resp in responses.items()}
    grades: Grades = {a: [[{} for _ in row] for row in texts[a]] for a in present}
    refs = [(a, p, s) for a in present for p, row in enumerate(texts[a]) for s in range(len(row))]

    work: dict[str, list[Ref]] = {g: [] for g in present}
    for a in present:
        for g in peer_graders(a, present, cfg.reward.judge.k):
            work[g].extend(r for r in refs if r[0] == a)

    def request(rs: list[Ref]) -> GradeRequest:
        items = [GradeItem(prompt=prompts[p], response=texts[a][p][s]) for a, p, s in rs]
        return GradeRequest(
            items=items, task=task.name, mode="judge", format=task.prompt_format, rubric=cfg.task.rubric
        )

    async def member_grades(g: str) -> None:
        if not work[g]:
            return
        try:
            verdicts = await client.judge(cfg.member(g), request(work[g]))
        except MemberError as err:
            log.warning("round %d: member %s could not grade: %s", round_, g, err)
            return
        for (a, p, s), score in zip(work[g], verdicts.scores, strict=True):
            if score is not None:  # an outside endpoint's unreadable verdict: no say on that response
                grades[a][p][s][g] = score

    external = await pool.graders() if pool else []
    # External graders each see a bounded, evenly spread subset of the round's responses.
    stride = max(1, len(refs) // settings.items_per_round)
    ext_refs = refs[::stride][: settings.items_per_round]

    async def push(grader: Grader) -> None:
        assert grader.url is not None
        try:
            resp = await asyncio.wait_for(
                client.grade([grader.url], request(ext_refs), settings.push_timeout_s),
                timeout=settings.push_timeout_s,
            )
        except (MemberError, TimeoutError) as err:
            metrics.push_failures.labels(grader.name).inc()
            log.warning("round %d: push grader %s failed: %s", round_, grader.name, err)
            return
        for (a, p, s), score in zip(ext_refs, resp.scores, strict=True):
            grades[a][p][s][grader.name] = score

    async def pull(graders: list[Grader]) -> None:
        if not graders or pool is None:
            return
        deadline = time.time() + settings.pull_deadline_s
        task_ref: dict[str, Ref] = {}
        task_owner: dict[str, str] = {}
        pairs = [(prompts[p], texts[a][p][s]) for a, p, s in ext_refs]
        for g in graders:
            for tid, ref in zip(await pool.offer(round_, g.name, pairs, deadline), ext_refs, strict=True):
                task_ref[tid], task_owner[tid] = ref, g.name
        for tid, score in (await pool.collect(round_, task_owner, deadline)).items():
            a, p, s = task_ref[tid]
            grades[a][p][s][task_owner[tid]] = score

    await asyncio.gather(
        *(member_grades(g) for g in present),
        *(push(g) for g in external if g.mode == "push"),
        pull([g for g in external if g.mode == "pull"]),
    )
    return grades
