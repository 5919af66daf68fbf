"""The readers take what a model wrote, never what the grader computes (issue: the grader did the
arithmetic, and models learnt to restate the question)."""

from __future__ import annotations

import pytest

from corl.tasks import Example, get_task
from corl.tasks.literal import literal_answer, reducible

ARITH = get_task("arith")
MATH = get_task("math")

RESTATEMENTS = [
    "Calculate 61 * 41.",
    "61 * 41",
    "61*41",
    "To calculate 4 * -83, we need to",
    "I think 37 + 45 but not sure",
    "To calculate 8 / 2, we need to follow these steps:",
    "8/2",
    "7-6",
    "7 -6",
    "Calculate 2 - -1.",
    "The answer is 8/2.",
    "#### 61 * 41",
    "\\boxed{61 \\times 41}",
    "\\boxed{\\frac{8}{2}}",
    "The answer is 6 * 7.",
]


@pytest.mark.parametrize("task", [ARITH, MATH], ids=["arith", "math"])
@pytest.mark.parametrize("completion", RESTATEMENTS)
def test_restating_or_echoing_an_expression_is_no_answer(task, completion: str) -> None:
    assert task.extract_answer("Calculate 61 * 41.", completion) is None


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("2501", "2501"),
        ("-4", "-4"),
        ("-4.0", "-4"),
        ("$-4$", "-4"),
        ("The answer is -4.", "-4"),
        ("\\boxed{-4}", "-4"),
        ("61 * 41 = 2501", "2501"),  # a computation's result is what the model wrote after the sign
        ("-8 / 2 = -4", "-4"),
        ("$1,250", "1250"),
        ("25%", "25"),
        ("It is 7 apples.", "7"),
        ("The answer is 7 apples.", "7"),
        ("0.50", "1/2"),
        ("#### 3*4=12", "12"),
    ],
)
def test_literal_numbers_are_read_with_units_commas_and_signs(completion: str, expected: str) -> None:
    assert ARITH.extract_answer("Calculate 1 + 1.", completion) == expected
    assert MATH.extract_answer("Calculate 1 + 1.", completion) == expected


def test_a_number_copied_from_the_question_is_a_restatement_not_an_answer() -> None:
    prompt = "Ray had 25 lollipops. He kept 5 lollipops and shared the rest. How many did he keep?"
    assert ARITH.extract_answer(prompt, "Ray had 25 lollipops. He kept 5 lollipops and shared the rest.") is None
    assert ARITH.extract_answer(prompt, "He kept 5 of them.") == "5"  # its own words around the number
    assert ARITH.extract_answer(prompt, "5") == "5"  # a bare number is an answer, even one the prompt holds


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("So.\n#### 3 + 2\\sqrt{2}", "2*sqrt(2) + 3"),  # closed forms are values, not arithmetic to do
        ("\\boxed{\\frac{1}{2}}", "1/2"),
        ("#### 2^{10}", "1024"),
        ("#### n(n-3)/2", "(n*(n - 3))/2"),
        ("#### x=2, y=1", None),  # read by math-verify as a system: not None below
    ],
)
def test_math_still_reads_closed_forms(completion: str, expected: str | None) -> None:
    got = MATH.extract_answer("q", completion)
    assert got is not None
    if expected is not None:
        assert got == expected


def test_arith_reads_literal_numbers_only() -> None:
    assert ARITH.extract_answer("q", "\\boxed{\\frac{1}{2}}") is None  # no digits picked out of LaTeX
    assert ARITH.extract_answer("q", "\\boxed{\\text{-4}}") == "-4"


@pytest.mark.parametrize(
    ("span", "expected"),
    [
        ("8/2", True),
        ("\\frac{6}{4}", True),
        ("2 \\cdot 3", True),
        ("61 * 41 apples", True),
        ("(1+2)", True),
        ("1/2 + 1/3", True),
        ("8 - 2 * 3", True),
        ("1/2", False),
        ("\\frac{1}{2}", False),
        ("3 + 2\\sqrt{2}", False),
        ("2^{10}", False),
        ("x^2 + 1", False),
        ("n(n-3)/2", False),
        ("1-1/2^(1/n)", False),
        ("-4", False),
    ],
)
def test_reducible_spans_hold_arithmetic_still_to_do(span: str, expected: bool) -> None:
    assert reducible(span) is expected


def test_the_fallback_takes_the_last_number_that_is_not_an_operand() -> None:
    assert literal_answer("He has 12 - 2 = 10 apples left.") == "10"
    assert literal_answer("Calculate -8 / 2.") is None
    assert literal_answer("x = 2") == "2"


def test_a_sympy_gold_answer_is_read_as_sympy_not_latex() -> None:
    """``(n + 1)**(n - 1)`` read as LaTeX was 1, so "1" was graded right on CHAMP problems."""
    ex = Example("How many parking functions, as an expression of n?", "(n + 1)**(n - 1)")
    assert not MATH.is_correct(ex, "#### 1")
    assert MATH.is_correct(ex, "#### (n+1)^{n-1}")


@pytest.mark.parametrize(
    ("task", "completion", "formatted"),
    [
        ("arith", "-4", True),
        ("arith", " 2501\n", True),
        ("arith", "The answer is 4.", False),
        ("arith", "8/2", False),
        ("math", "3 * 4 = 12\n#### 12", True),
        ("math", "so #### 12", False),
        ("math", "The answer is 12.", False),
        ("math", "#### 8/2", False),
        ("addition", "42", True),
        ("addition", "42 apples", False),
    ],
)
def test_formatted_means_the_form_the_prompt_asks_for(task: str, completion: str, formatted: bool) -> None:
    assert get_task(task).is_formatted("q", completion) is formatted
