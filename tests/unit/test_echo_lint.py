"""The echo lint over every task and packaged source: a response that only restates the prompt (or an
expression in it, in any answer slot) is graded correct on at most 1% of the held-out items."""

from __future__ import annotations

import logging

import pytest

from corl.config import TaskConfig
from corl.data import load_splits
from corl.tasks import Example, get_task
from corl.tasks.echo import LIMIT, echo_graded_correct, echoes

TRIO_ARITH = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
SOURCES = [
    ("addition", None, {}),
    ("arith", "gym:basic_arithmetic", TRIO_ARITH),
    ("arith", "gym:basic_arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 3}),
    ("arith", "packaged:gsm8k", {}),
    ("math", "packaged:gsm8k", {}),
    ("math", "packaged:champ", {}),
    ("code", "packaged:humaneval", {}),
]


@pytest.mark.parametrize(("task", "source", "options"), SOURCES, ids=[f"{t}-{s}" for t, s, _ in SOURCES])
def test_an_echo_is_almost_never_graded_correct(task: str, source: str | None, options: dict) -> None:
    cfg = (
        TaskConfig(name=task, source=source, options=options, size=600, eval_size=200)
        if source
        else TaskConfig(name=task)
    )
    splits = load_splits(cfg, 0)
    held_out = splits.eval or splits.rl
    assert len(held_out) >= 20
    assert echo_graded_correct(get_task(task), held_out) <= LIMIT


class Computing:
    """The old reader's behaviour: an expression in the text is read as its value."""

    name = "computing"

    def is_correct_many(self, pairs):
        out = []
        for ex, text in pairs:
            expr = text.removeprefix("Calculate ").rstrip(".")
            try:
                out.append(str(int(eval(expr, {}))) == ex.answer)  # noqa: S307 (test data: digits and operators)
            except Exception:
                out.append(False)
        return out


EXAMPLES = [Example(f"Calculate {a} * {b}.", str(a * b)) for a in range(2, 12) for b in range(3, 9)]


def test_the_lint_catches_a_reader_that_computes() -> None:
    assert echo_graded_correct(Computing(), EXAMPLES) == 1.0  # type: ignore[arg-type]
    assert echo_graded_correct(get_task("arith"), EXAMPLES) == 0.0
    assert "61 * 41" in echoes("Calculate 61 * 41.") and "#### 61*41" in echoes("Calculate 61 * 41.")


def test_the_aggregator_warns_at_start_up_when_echoes_score(caplog: pytest.LogCaptureFixture) -> None:
    from corl.services.aggregator.prompts import lint_echo

    with caplog.at_level(logging.WARNING):
        assert lint_echo(Computing(), EXAMPLES) == 1.0  # type: ignore[arg-type]
        assert lint_echo(get_task("arith"), EXAMPLES) == 0.0
    assert caplog.text.count("echo lint") == 1
