"""The echo lint: how often a response that only restates the prompt is graded correct.

A reader that computes the value of what it reads rewards restating the question (``"Calculate 61 *
41."`` read as 2501). Whatever the task and data, such a response must (nearly) never be graded
right: the lint measures the share of items for which *any* echo is, over the prompt itself, each
arithmetic expression in it, and those expressions put in the answer slot (``#### 61 * 41``,
``\\boxed{61 * 41}``, "The answer is 61 * 41."). Run by the tests over every task and packaged
source, and by the aggregator on its prompts at start-up (a warning above ``LIMIT``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .base import Example, Task, is_correct_many

LIMIT = 0.01  # share of items an echo may be graded right on (a number that happens to be the answer)
_EXPRESSION = re.compile(r"-?\d+(?:\.\d+)?(?:\s*(?:[-+*/×÷]|\\times|\\cdot|\\div)\s*\(?-?\d+(?:\.\d+)?\)?)+")


def echoes(prompt: str) -> list[str]:
    """Responses that only restate ``prompt``: itself, and each expression in it, bare, without spaces
    and in every answer slot the readers know."""
    out = [prompt]
    for expr in dict.fromkeys(m.group(0) for m in _EXPRESSION.finditer(prompt)):
        for e in dict.fromkeys([expr, re.sub(r"\s+", "", expr)]):
            out += [e, f"{e}.", f"The answer is {e}.", f"#### {e}", f"\\boxed{{{e}}}", f"{e} = ?"]
    return out


def echo_graded_correct(task: Task, examples: Sequence[Example]) -> float:
    """Share of ``examples`` (with answers) for which some echo of the prompt is graded correct."""
    labelled = [e for e in examples if e.answer is not None or e.meta]
    if not labelled:
        return 0.0
    pairs = [(e, echo) for e in labelled for echo in echoes(e.prompt)]
    correct = is_correct_many(task, [e for e, _ in pairs], [echo for _, echo in pairs])
    hit: dict[int, bool] = {}
    for (e, _), ok in zip(pairs, correct, strict=True):
        hit[id(e)] = hit.get(id(e), False) or ok
    return sum(hit.values()) / len(labelled)
