"""Held-out evaluation through a model server's ``/v1/generate``: greedy pass@1 and maj@k.

Whatever the server serves is what is measured (its weight version, its prompt rendering, its
sampling), so ``corl run``'s periodic readings, ``corl eval --config`` and ``corl experiment
--config`` agree. Correctness is the task's own (math-verify against the data set's answer, or a
program's hidden tests run in the sandbox); majority voting uses the same canonical answers the
peer rewards use, so for code maj@k is the behaviour group most samples fall in (ties: the answer
sampled first).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from corl.cohort import metrics
from corl.proto import GenerateRequest, GenerateResponse, SamplingSettings
from corl.tasks import Example, Task, extract_all, is_correct_many


@dataclass
class ServerEval:
    """One member's readings on ``n`` problems (accuracies in [0, 1])."""

    n: int
    weight_version: int
    pass_at_1: float  # greedy
    parsed: float | None = None  # share of greedy answers the task's reader takes
    formatted: float | None = None  # share of greedy answers in the form the task asks for
    k: int = 0  # samples per problem for maj@k (0: not measured)
    sample_acc: float | None = None  # mean accuracy of the k samples (pass@1 at the sampling temperature)
    maj_at_k: float | None = None
    distinct: float | None = None  # mean distinct valid answers among the k samples
    valid_rate: float | None = None  # share of the k samples with a readable answer
    greedy_correct: list[bool] = field(default_factory=list, repr=False)  # per problem, in order

    def row(self) -> dict[str, float | int | None]:
        """The readings taken (greedy only: no sampled fields)."""
        greedy: dict[str, float | int | None] = {
            "n": self.n,
            "weight_version": self.weight_version,
            "pass@1": self.pass_at_1,
            "parsed": self.parsed,
            "formatted": self.formatted,
        }
        if not self.k:
            return greedy
        sampled = {"sample_acc": self.sample_acc, f"maj@{self.k}": self.maj_at_k, "distinct": self.distinct}
        return {**greedy, "k": self.k, **sampled, "valid_rate": self.valid_rate}


def _majority(answers: Sequence[str | None]) -> str | None:
    """The most frequent valid answer, ties going to the one sampled first (maj@k's usual rule)."""
    top = Counter(a for a in answers if a is not None).most_common(1)
    return top[0][0] if top else None


def generate(
    http: httpx.Client,
    server: str,
    task: Task,
    prompts: Sequence[str],
    sampling: SamplingSettings,
    n: int,
    seed: int | None = None,
) -> tuple[list[list[str]], int]:
    """``n`` completions of each prompt from ``server`` and the weight version that made them."""
    req = GenerateRequest.of(list(prompts), sampling, n=n, format=task.prompt_format, seed=seed)
    resp = http.post(f"{server}/v1/generate", json=req.model_dump())
    resp.raise_for_status()
    out = GenerateResponse.model_validate(resp.json())
    return [[s.text for s in r.samples] for r in out.results], out.weight_version


def evaluate_server(
    http: httpx.Client,
    server: str,
    task: Task,
    examples: Sequence[Example],
    sampling: SamplingSettings,
    *,
    k: int = 0,
    chunk: int = 8,
    seed: int = 0,
    advance: Callable[[int], None] = lambda n: None,
) -> ServerEval:
    """Greedy pass@1 on ``examples`` and, when ``k`` > 1, maj@k over ``k`` samples at
    ``sampling.temperature`` (request ``j`` seeded ``seed + j``); requests carry ``chunk`` problems;
    ``advance(n)`` after each request."""
    greedy_sp = sampling.model_copy(update={"temperature": 0.0})
    hits: list[bool] = []
    parsed: list[bool] = []
    formatted: list[bool] = []
    versions: set[int] = set()
    for i in range(0, len(examples), chunk):
        part = examples[i : i + chunk]
        texts, version = generate(http, server, task, [e.prompt for e in part], greedy_sp, 1)
        versions.add(version)
        greedy = [t[0] for t in texts]
        hits += is_correct_many(task, part, greedy)
        shaped = [task.is_formatted(e.prompt, t) for e, t in zip(part, greedy, strict=True)]
        formatted += shaped
        # The code task's reader takes a program that defines the function (its form); reading its
        # behaviour would run every program a second time, after the hidden tests.
        read = (
            shaped
            if task.runs_code
            else [a is not None for a in extract_all(task, list(zip([e.prompt for e in part], greedy, strict=True)))]
        )
        parsed += read
        advance(len(part))
    result = ServerEval(
        n=len(examples),
        weight_version=max(versions, default=0),
        pass_at_1=metrics.mean(hits),
        parsed=metrics.mean(parsed),
        formatted=metrics.mean(formatted),
        greedy_correct=hits,
    )
    if k < 2:
        return result
    sample_hits: list[bool] = []
    maj_hits: list[bool] = []
    distinct: list[float] = []
    valid: list[bool] = []
    for i in range(0, len(examples), chunk):
        part = examples[i : i + chunk]
        texts, version = generate(http, server, task, [e.prompt for e in part], sampling, k, seed + i // chunk)
        versions.add(version)
        pairs = [(e.prompt, t) for e, group in zip(part, texts, strict=True) for t in group]
        answers = extract_all(task, pairs)
        flat_examples = [e for e in part for _ in range(k)]
        correct = is_correct_many(task, flat_examples, [t for _, t in pairs])
        for j in range(len(part)):
            group = answers[j * k : (j + 1) * k]
            winner = _majority(group)
            # A majority answer is right when the samples that gave it are (they are equal answers).
            maj_hits.append(winner is not None and correct[j * k + group.index(winner)])
            distinct.append(metrics.distinct_count(group))
        sample_hits += correct
        valid += [a is not None for a in answers]
        advance(len(part))
    result.k = k
    result.sample_acc = metrics.mean(sample_hits)
    result.maj_at_k = metrics.mean(maj_hits)
    result.distinct = metrics.mean(distinct)
    result.valid_rate = metrics.mean(valid)
    result.weight_version = max(versions)
    return result
