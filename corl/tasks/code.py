"""HumanEval-style function completion, graded by execution in the sandbox.

A completion's *answer* is its program's behaviour: the outputs (``repr``, or the exception type)
of the prompt's function on the example calls written in the prompt's own docstring, computed in
``corl.sandbox``. Programs that behave the same vote together, so peer labels work unchanged and no
label or hidden test reaches a reward. Prompts whose docstring has no example call give no answers
(no votes). Held-out evaluation (``is_correct``) runs the data set's hidden tests, also sandboxed.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from corl.proto import PromptFormat
from corl.sandbox import Limits, run_python

from . import code_text
from .base import Example, FromData, Verdicts

T = TypeVar("T")
R = TypeVar("R")


def _parallel(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    unique = list(dict.fromkeys(items))  # equal programs behave the same: run each once
    if len(unique) <= 1 or workers <= 1:
        done = {u: fn(u) for u in unique}
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(unique)), thread_name_prefix="sandbox") as pool:
            done = dict(zip(unique, pool.map(fn, unique), strict=True))
    return [done[i] for i in items]


@dataclass(frozen=True)
class CodeTask(FromData, Verdicts):
    name: str = "code"
    suggested_source: ClassVar[str] = "packaged:humaneval"
    runs_code: ClassVar[bool] = True  # answers are behaviours of programs run in the sandbox
    max_tokens: int = 256  # a HumanEval function body; the model server bounds it at 256 by default
    correct_token: str = "Yes"
    incorrect_token: str = "No"
    limits: Limits = field(default_factory=lambda: Limits(timeout_s=5.0, cpu_s=3, memory_bytes=1 << 30))
    workers: int = field(default_factory=lambda: max(1, min(8, os.cpu_count() or 1)))

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat(
            chat=True,
            system="Complete the following Python function. Reply with the complete function in one "
            "```python code block, without tests or example usage.",
            template="{prompt}",  # a base model simply continues the function body
        )

    @property
    def stop(self) -> tuple[str, ...]:
        # The end of a fenced block (chat) or the start of test code (plain continuation). Not "\ndef":
        # a chat answer starts with its own "def".
        return ("\n```\n", "\nif __name__", "\nprint(", "\nassert ")

    def example(self, record: Mapping[str, Any]) -> Example:
        """A HumanEval record: the prompt; the hidden tests and entry point ride in ``meta`` (evaluation only)."""
        prompt = str(record["prompt"])
        meta = {k: record[k] for k in ("task_id", "test", "entry_point") if k in record}
        return Example(prompt, None, meta)

    # --- answers (votes) ------------------------------------------------------------------------
    def _behaviour(self, job: tuple[str, tuple[str, ...]]) -> str | None:
        src, calls = job
        nonce = secrets.token_hex(8)
        res = run_python(code_text.behaviour_harness(src, list(calls), nonce), self.limits)
        out = code_text.read_behaviour(res.stdout, nonce) if res.ok else None
        if out is None or all(o.startswith("!") for o in out):
            return None  # crashed, timed out, or raised on every input: no valid answer
        return "behaviour:" + hashlib.sha256(json.dumps(out).encode()).hexdigest()[:16]

    def extract_answers(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        """Behaviour of every (prompt, completion) program; programs run concurrently, each sandboxed."""
        calls = {p: tuple(code_text.example_calls(p)) for p in dict.fromkeys(p for p, _ in pairs)}
        jobs: list[tuple[str, tuple[str, ...]] | None] = []
        for p, c in pairs:
            src = code_text.program(p, c) if calls[p] else None
            jobs.append((src, calls[p]) if src is not None else None)
        runnable = [j for j in jobs if j is not None]
        results = iter(_parallel(self._behaviour, runnable, self.workers))
        return [next(results) if j is not None else None for j in jobs]

    def extract_answer(self, prompt: str, completion: str) -> str | None:
        return self.extract_answers([(prompt, completion)])[0]

    def is_formatted(self, prompt: str, completion: str) -> bool:
        """A program that defines the prompt's function (run nothing)."""
        return code_text.program(prompt, completion) is not None

    # --- evaluation -------------------------------------------------------------------------------
    def _passes(self, job: tuple[str, str, str]) -> bool:
        src, test, name = job
        nonce = secrets.token_hex(8)
        res = run_python(code_text.hidden_test_harness(src, test, name, nonce), self.limits)
        return res.ok and code_text.tests_passed(res.stdout, nonce)

    def is_correct_many(self, pairs: Sequence[tuple[Example, str]]) -> list[bool]:
        """Does each completion pass its example's hidden tests? Evaluation only; run concurrently."""
        jobs: list[tuple[str, str, str] | None] = []
        for ex, completion in pairs:
            src = code_text.program(ex.prompt, completion)
            test, name = ex.meta.get("test"), ex.meta.get("entry_point") or code_text.entry_point(ex.prompt)
            jobs.append((src, str(test), str(name)) if src is not None and test and name else None)
        runnable = [j for j in jobs if j is not None]
        results = iter(_parallel(self._passes, runnable, self.workers))
        return [next(results) if j is not None else False for j in jobs]

    def is_correct(self, example: Example, completion: str) -> bool:
        return self.is_correct_many([(example, completion)])[0]

    def judge_prompt(self, prompt: str, response: str) -> str:
        return (
            f"Task: complete this Python function.\n{prompt}\n\nProposed solution:\n{response}\n\n"
            "Is the solution correct? Answer Yes or No: "
        )
