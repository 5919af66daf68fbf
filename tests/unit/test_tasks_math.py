"""The math task on real GSM8K and CHAMP items (fetched from PyPI packages, cached) and on the kinds of
completions small instruct and base models really write."""

from __future__ import annotations

from typing import Any

import pytest

from corl.data.sources import read_packaged
from corl.tasks import Example, MathTask, extract_all, get_task
from corl.tasks.math import answer_span, canonical_answer


@pytest.fixture(scope="module")
def task() -> MathTask:
    t = get_task("math")
    assert isinstance(t, MathTask)
    return t


@pytest.fixture(scope="module")
def gsm8k() -> list[dict[str, Any]]:
    return read_packaged("gsm8k")[0]


@pytest.fixture(scope="module")
def champ() -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in read_packaged("champ")[0]}


def test_gsm8k_answers_agree_with_the_worked_solutions(task: MathTask, gsm8k: list[dict[str, Any]]) -> None:
    assert len(gsm8k) == 100
    for record in gsm8k:
        ex = task.example(record)
        assert ex.answer is not None and ex.prompt == record["prompt"]
        # The upstream worked solution ends "#### N": reading it as a completion gives the same answer.
        assert task.extract_answer(ex.prompt, record["upstream_answer"]) == ex.answer
        assert task.is_correct(ex, record["upstream_answer"])


# Completions in the styles SmolLM2-Instruct and a base model write (answer 18 for gsm8k-test-0013).
RIGHT = [
    "First, 5 * 2 = 10. Then 10 + 2 = 12. 12 is 2/3 of the total, so 12 / (2/3) = 18.\n#### 18",
    "She had 12 before the red house, so she started with 18.\n\nThe answer is 18.",
    "Let x be the number. x - x/3 - 2 = 12 ... x = 18.\nFinal answer: $\\boxed{18}$",
    "So Melanie started with **18** vacuum cleaners.",
    "#### 18.0",
    "The final answer is 18. I hope it is correct.",
    "... = 18\n#### 18\n\nQuestion: Tom has 3 apples and buys 5 more. How many?\nAnswer: 8\n#### 8",
]
WRONG = ["5 * 2 = 10, and 10 + 2 = 12.\n#### 12", "The answer is 20.", "I cannot solve this problem.", ""]


# Real greedy completions to GSM8K items under this task's prompts: SmolLM2-135M-Instruct (chat), Gemma-3-270M.
REAL_OUTPUTS = [
    ("Melanie has 5 vacuum cleaners left.\n#### 5\nThe answer is: 5", "5"),
    (
        "... So, the total number of kittens is 7 + 12 = 19.\n\nWe can calculate this by multiplying the number "
        "of cats by the number of kittens: 7 * 19 = 105.\n\nThe Doubtfire family now has 105 kittens.\n\n"
        "The answer is: 105",
        "105",
    ),
    (
        "Marilyn's first record sold 10 times as many copies as Harald's, so she sold 10 * 10 = 100 copies.\n"
        + "#### 100\n" * 30
        + "####",
        "100",
    ),  # ran into max_tokens repeating its answer line
    # Gemma-3-270M (base model, plain template with its worked example; generation stopped at "\nQuestion:").
    (" Melanie has 5 * 2 = 10.\n#### 10\n", "10"),
    (" Tom's ship can travel at 10 miles per hour.  He is sailing from 1 to 4 PM.\n#### 6\n", "6"),
]


@pytest.mark.parametrize(("completion", "expected"), REAL_OUTPUTS)
def test_real_small_model_outputs_are_read(task: MathTask, completion: str, expected: str) -> None:
    assert task.extract_answer("q", completion) == expected


def test_realistic_completions_are_read(task: MathTask, gsm8k: list[dict[str, Any]]) -> None:
    ex = task.example(next(r for r in gsm8k if r["id"] == "gsm8k-test-0013"))
    assert ex.answer == "18"
    # The plain template stops at "\nQuestion:", but a completion that ran on still reads its own #### first.
    assert [task.is_correct(ex, c) for c in RIGHT[:-1]] == [True] * (len(RIGHT) - 1)
    assert task.extract_answer(ex.prompt, RIGHT[-1]) == "8"  # last answer wins: stop strings prevent this
    assert "\nQuestion:" in task.stop
    assert [task.is_correct(ex, c) for c in WRONG] == [False] * len(WRONG)
    assert task.extract_answer(ex.prompt, WRONG[2]) is None


@pytest.mark.parametrize(
    "variants",
    [
        ["#### 1000", "The answer is $1,000.", "\\boxed{1000}", "#### 1,000.00"],
        ["\\boxed{\\frac{1}{2}}", "The answer is 0.5", "#### 1/2", "Final answer: 0.50"],
        ["#### 12.5", "\\boxed{\\frac{25}{2}}", "The answer is $12.50."],
        ["#### -4", "The answer is -4.", "\\boxed{-4}"],
        # The percent sign is a unit (GSM8K's answer to "what percent" is the bare number); seen on
        # SmolLM2, "5%" stayed an unevaluated 5*(1/100) and split the vote with "5".
        ["#### 25%", "The answer is 25 %.", "\\boxed{25\\%}", "#### 25"],
        ["So you pay 5% of it: 5%", "#### 5", "The answer is 5.0"],
    ],
)
def test_equal_values_vote_together(task: MathTask, variants: list[str]) -> None:
    answers = extract_all(task, [("q", v) for v in variants])
    assert None not in answers and len(set(answers)) == 1, answers


def test_different_values_never_vote_together(task: MathTask) -> None:
    answers = extract_all(task, [("q", c) for c in ["#### 18", "#### 180", "#### 1.8", "#### 81"]])
    assert len(set(answers)) == 4


@pytest.mark.parametrize(
    ("problem", "completion", "right"),
    [
        ("P_Inequality_21", "So the minimum is $\\boxed{\\frac{1}{n+1}}$.", True),
        ("P_Inequality_21", "So the minimum is $\\boxed{\\frac{1}{n}}$.", False),
        ("P_Combinatorics_1", "Summing the counts gives 239 strings.\n#### 239", True),
        ("P_Inequality_1", "The range is $\\boxed{[-1, 1]}$", True),
        ("P_Inequality_1", "The range is $\\boxed{(-1, 1)}$", False),
    ],
)
def test_champ_answers_in_latex_are_equivalent(
    task: MathTask, champ: dict[str, dict[str, Any]], problem: str, completion: str, right: bool
) -> None:
    ex = task.example(champ[problem])
    assert ex.answer is not None
    assert task.is_correct(ex, completion) is right


def test_prose_answers_are_not_turned_into_nonsense() -> None:
    assert canonical_answer("No") is None
    assert canonical_answer("1,000") == "1000"
    assert canonical_answer("First 5*2=<<5*2=10>>10\n#### 18") == "18"


def test_answer_span_prefers_the_marked_answer() -> None:
    assert answer_span("3 + 4 = 7 and 7 * 2 = 14\n#### 14 apples") == "14 apples"
    assert answer_span("boxed first \\boxed{3}, then #### 4") == "\\boxed{3}"
    assert answer_span("no marker 1 2 3") == "no marker 1 2 3"


def test_dataset_answers_stay_out_of_extraction(task: MathTask) -> None:
    # Extraction reads only the completion: the same completion gives the same answer whatever the label.
    a = Example("q", "18")
    b = Example("q", "99")
    assert task.extract_answer(a.prompt, "#### 18") == task.extract_answer(b.prompt, "#### 18") == "18"
    assert task.is_correct(a, "#### 18") and not task.is_correct(b, "#### 18")


def test_prompt_format_asks_for_the_form_the_extractor_reads(task: MathTask) -> None:
    fmt = task.prompt_format
    assert fmt.chat and fmt.system is not None and "#### <answer>" in fmt.system
    assert "{system}" in fmt.template and fmt.template.endswith("Question: {prompt}\nAnswer:")
    shot = fmt.template.split("Question: ")[1]  # the worked example a base model sees reads as its answer
    assert task.extract_answer("q", shot.split("Answer:")[1]) == "10"
    assert 256 <= task.max_tokens <= 1024
    assert "Yes or No" in task.judge_prompt("q", "r") and task.verdict_tokens == ("Yes", "No")
