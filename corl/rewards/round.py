"""One round, graded: the members' samples in, everything the round decides out.

``grade_round`` is pure: it reads answers with the task, computes rewards with the mode's function
from ``REWARD_MODES``, measures what the cohort learns about its graders, and the diagnostics. The
aggregator calls it between its I/O (generation before, the Redis commit after), and so does the
lockstep loop of ``bench/pipeline.py``. Dataset answers reach a reward function only when its mode
uses labels; otherwise they are read here for one diagnostic (pseudo-label accuracy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corl.config import RewardConfig
from corl.proto import BatchDiagnostics, GenerateResponse
from corl.tasks import Task, extract_all

from .diagnostics import (
    agreement_matrix,
    answer_stats,
    cohort_diversity,
    label_accuracy,
    label_share,
    majority_ratio,
    reward_accuracy,
)
from .guard import echo_share
from .inputs import Answers, RewardInputs
from .modes import REWARD_MODES, RewardMode
from .reliability import grade_agreements, peer_vote_agreements, vote_grounded_agreements

Grades = Mapping[str, Sequence[Sequence[Mapping[str, float]]]]  # author -> [prompt][sample] -> {grader: score}


@dataclass(frozen=True)
class MemberOutcome:
    answers: list[list[str | None]]  # [prompt][sample] canonical answers
    rewards: list[list[float]]
    labels: list[str | None]  # the supervision label per prompt (None: unlabelled)
    pseudo_labels: list[str | None]  # the plurality of the member's own samples per prompt
    diagnostics: BatchDiagnostics
    distinct_rate: float  # distinct answers / G, averaged over prompts: the collapse signal
    pseudo_label_accuracy: float | None  # the member's own plurality vs dataset answers; a diagnostic
    label_accuracy: float | None  # the supervision label vs dataset answers (TTRL); a diagnostic
    reward_accuracy: float | None  # rewarded exactly when right (TTRL); a diagnostic
    majority_ratio: float  # share of G samples giving the plurality answer
    weights: list[float]  # advantage weight per prompt (1.0 unless the mode weighs prompts)
    label_share: float | None = None  # share of the other members' labels equal to this member's pseudo-label
    echo_share: float = 0.0  # share of valid answers copied from the prompt (a collapse signal)
    formatted_share: float = 1.0  # share of samples in the asked form (a collapse signal)


@dataclass(frozen=True)
class RoundOutcome:
    mode: RewardMode
    members: dict[str, MemberOutcome]  # every member that answered this round
    agreement: dict[str, dict[str, float]]  # pseudo-label agreement between members
    cohort_diversity: float  # distinct pseudo-labels across members per prompt / members
    grader_agreements: dict[str, float]  # what this round measured of each grader's reliability


def extract_answers(responses: Mapping[str, GenerateResponse], task: Task) -> dict[str, list[list[str | None]]]:
    """member -> [prompt][sample] canonical answers (one batched call: a task may run programs)."""
    pairs = [(pr.prompt, s.text) for resp in responses.values() for pr in resp.results for s in pr.samples]
    flat = iter(extract_all(task, pairs))
    return {m: [[next(flat) for _ in pr.samples] for pr in resp.results] for m, resp in responses.items()}


def formatted_flags(responses: Mapping[str, GenerateResponse], task: Task) -> dict[str, list[list[bool]]]:
    """member -> [prompt][sample]: is the sample in the form the task asks for?"""
    return {
        m: [[task.is_formatted(pr.prompt, s.text) for s in pr.samples] for pr in resp.results]
        for m, resp in responses.items()
    }


def response_tokens(resp: GenerateResponse) -> int:
    """Tokens of a member's samples: their token ids, or the usage an outside endpoint reported (its
    samples carry text only)."""
    counted = sum(len(s.token_ids) for pr in resp.results for s in pr.samples)
    return resp.usage.completion_tokens if resp.usage is not None and not counted else counted


def member_diagnostics(
    answers: Sequence[Sequence[str | None]],
    rewards: Sequence[Sequence[float]],
    labels: Sequence[str | None],
    response_tokens: int,
) -> tuple[BatchDiagnostics, float]:
    """A member's batch diagnostics and its distinct-answer rate (distinct / G, the collapse signal)."""
    n_samples = sum(len(r) for r in rewards) or 1
    distinct = entropy = rate = 0.0
    for samples in answers:
        d, h = answer_stats(samples)
        distinct += d
        entropy += h
        rate += d / len(samples) if samples else 0.0
    n_prompts = len(answers) or 1
    diag = BatchDiagnostics(
        mean_reward=sum(map(sum, rewards)) / n_samples,
        label_rate=sum(1 for lab in labels if lab is not None) / (len(labels) or 1),
        distinct_answers=distinct / n_prompts,
        answer_entropy=entropy / n_prompts,
        mean_response_tokens=response_tokens / n_samples,
    )
    return diag, rate / n_prompts


def _share(flags: Sequence[Sequence[bool]]) -> float:
    n = sum(len(row) for row in flags)
    return sum(map(sum, flags)) / n if n else 1.0


def grade_round(
    responses: Mapping[str, GenerateResponse],
    task: Task,
    reward: RewardConfig,
    weights: Mapping[str, float],
    *,
    learnt_weights: Mapping[str, float] | None = None,
    order: Sequence[str] | None = None,
    teachers: Mapping[str, str] | None = None,
    dataset_answers: Sequence[str | None] | None = None,
    grades: Grades | None = None,
    answers: Answers | None = None,
    votes: Mapping[str, GenerateResponse] | None = None,
    seed: int = 0,
) -> RoundOutcome:
    """Grade one round of ``responses`` (member -> its generate response to the round's prompts).

    ``weights``: graders' effective reliabilities (they weigh peer_agreement votes and judge scores);
    ``learnt_weights``: their learnt weights, quarantined ones included, for measuring agreement
    (default ``weights``). ``order``: the cohort's member order (ring topology); ``teachers``:
    teacher -> the member it votes for. ``grades``: the
    judge scores of a judged mode. ``answers``: already extracted, else read here with ``task``.
    ``votes``: member -> its vote-only samples of the same prompts (``reward.votes``); they replace
    the rewarded samples as the member's ballots. ``seed``: the round's (the random control's draws).
    """
    mode = REWARD_MODES[reward.mode]
    present = list(responses)
    answers = answers if answers is not None else extract_answers(responses, task)
    ballots = extract_answers({m: votes[m] for m in present}, task) if votes is not None else None
    formatted = formatted_flags(responses, task)
    if mode.judged and grades is None:
        raise ValueError(f"{mode.name} needs the round's judge grades")
    out = mode.fn(
        RewardInputs(
            answers=answers,
            votes=ballots,
            members=present,
            threshold=reward.threshold,
            surer_peers=reward.surer_peers,
            topology=reward.topology,
            order=order,
            teachers=teachers,
            reliability=weights,
            dataset_answers=dataset_answers if mode.uses_labels else None,
            grades=grades,
            judge_combine=reward.judge.combine,
            judge_trim=reward.judge.trim,
            formatted=formatted if mode.formats else None,
            seed=seed,
            p=reward.p,
        )
    )
    members = {}
    shares = label_share(out.pseudo_labels, out.labels)
    for m in present:
        tokens = response_tokens(responses[m])
        diag, rate = member_diagnostics(answers[m], out.rewards[m], out.labels[m], tokens)
        truth = dataset_answers
        members[m] = MemberOutcome(
            answers=[list(r) for r in answers[m]],
            rewards=out.rewards[m],
            labels=out.labels[m],
            pseudo_labels=out.pseudo_labels[m],
            diagnostics=diag,
            distinct_rate=rate,
            pseudo_label_accuracy=label_accuracy(out.pseudo_labels[m], truth) if truth is not None else None,
            label_accuracy=label_accuracy(out.labels[m], truth) if truth is not None else None,
            reward_accuracy=reward_accuracy(answers[m], out.rewards[m], truth) if truth is not None else None,
            majority_ratio=majority_ratio(answers[m]),
            weights=out.weights[m] if out.weights is not None else [1.0] * len(answers[m]),
            label_share=shares[m],
            echo_share=echo_share([pr.prompt for pr in responses[m].results], answers[m]),
            formatted_share=_share(formatted[m]),
        )
    rel = reward.reliability
    if mode.judged and rel.grounding == "votes":
        assert grades is not None
        measured = vote_grounded_agreements(grades, answers, min_share=rel.min_consensus)
    elif mode.judged:
        assert grades is not None
        scored = [g for a in present for row in grades[a] for g in row if len(g) >= 2]
        measured = grade_agreements(scored, learnt_weights if learnt_weights is not None else weights)
    else:
        measured = peer_vote_agreements(out.pseudo_labels) if len(present) >= 2 else {}
    return RoundOutcome(
        mode=mode,
        members=members,
        agreement=agreement_matrix(out.pseudo_labels),
        cohort_diversity=cohort_diversity(out.pseudo_labels),
        grader_agreements=measured,
    )
