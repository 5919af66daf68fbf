"""Math word problems (GSM8K, CHAMP, generated, or any user file) graded with ``math-verify``.

The prompt asks for a final line ``#### <answer>``; extraction also reads the conventions models
really use: ``\\boxed{}``, ``#### x``, "the (final) answer is x", and otherwise the last number,
the last answer in the text winning within each convention. Answers are canonicalised so that
equal values vote together: ``\\frac{1}{2}``, ``0.5`` and ``1/2`` all become ``1/2``; ``18.0``,
``$18`` and ``18`` become ``18``; thousands separators and units are dropped, the percent sign
among them (``25%`` is ``25``, as GSM8K writes the answer of a "what percent" question).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from corl.proto import PromptFormat

from . import bounded, literal
from .base import Example, FromData, OneByOne, Verdicts, record_fields

_TAIL = 4000  # characters of a completion searched for its answer: bounds parsing time
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|=|:)\s*[:]?\s*([^\n]+?)(?:\.\s|\.?\s*$|\n)", re.I | re.M
)
_GSM8K_CALC = re.compile(r"<<[^<>]*>>")
_PERCENT = re.compile(r"(?<=\d)\s*\\?%")  # "25%", "25 %", LaTeX "25\%": the sign is a unit
_SHOT = (
    "Question: Tom has 3 boxes with 4 apples each. He eats 2 apples. How many apples are left?\n"
    "Answer: Tom has 3 * 4 = 12 apples. After eating 2 he has 12 - 2 = 10.\n#### 10\n\n"
)
_NUMBER = re.compile(r"-?\d+(?:/\d+)?")  # a canonical rational (literal.canonical_number, sympy's str)
_MATH_WORDS = {"sqrt", "frac", "dfrac", "pi", "infty", "sin", "cos", "tan", "log", "ln", "exp", "cdot", "times"}

logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every parse without a timeout


def _last_boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start : i - 1]
    return None


def marked_answer(completion: str) -> tuple[str, bool] | None:
    """The final answer a completion marks (``\\boxed{}``, ``#### x``, "the answer is x"), the last one
    winning within each convention, and whether it was boxed; None when it marks none."""
    text = completion[-_TAIL:]
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed, True
    for pattern in (_HASHES, _ANSWER_IS):
        found = pattern.findall(text)
        if found:
            return str(found[-1]).strip().strip("*").strip(), False
    return None


def answer_span(completion: str) -> str:
    """The part of a written solution that states its final answer (the whole tail when none is marked)."""
    marked = marked_answer(completion)
    if marked is None:
        return completion[-_TAIL:]
    span, boxed = marked
    return f"\\boxed{{{span}}}" if boxed else span


def literal_span(span: str) -> str | None:
    """The part of a marked answer the model wrote as its value: after the ``=`` of a computation
    (``3 * 4 = 12`` states 12), or None when arithmetic is still to be done in it (``8/2``, ``61 * 41``)."""
    left, eq, right = span.partition("=")
    computed = eq and "=" not in right and re.search(r"\d", left)  # "3 * 4 = 12", not "x = 2, y = 1"
    value = (right if computed else span).strip()
    return None if not value or literal.reducible(value) else value


def _canonical(expr: Any) -> str:
    import sympy

    if isinstance(expr, sympy.Basic):
        floats = expr.atoms(sympy.Float)
        if floats:  # exact decimals: 12.50 and 25/2 are one answer
            expr = expr.xreplace({f: sympy.Rational(str(f)) for f in floats})
        if expr.is_number:
            try:
                expr = sympy.nsimplify(expr, rational=False) if not expr.is_Rational else expr
            except (TypeError, ValueError, AttributeError):
                pass
    return str(expr)


def parse_answer(text: str) -> Any | None:
    """math-verify's parse of an answer text (LaTeX or a plain expression); None when it has none.
    A percent sign is dropped first, as a unit: math-verify would read "5%" as 5*(1/100), unevaluated."""
    from math_verify import parse

    try:
        parsed = parse(_PERCENT.sub("", text), parsing_timeout=None)  # type: ignore[arg-type]  # no SIGALRM: we run in threads
    except Exception:  # math-verify/sympy raise many kinds on hostile text; unparseable is the answer
        return None
    return parsed[0] if parsed else None


def canonical_answer(text: str) -> str | None:
    """Canonical form of an answer written on its own (a data set's answer): ``$1,000`` -> ``1000``."""
    text = _GSM8K_CALC.sub("", text.strip())
    if "####" in text:  # a GSM8K-style worked solution
        text = answer_span(text)
    expr = _parse_written(text)
    return None if expr is None else _canonical(expr)


def _parse_written(text: str) -> Any | None:
    """math-verify's parse of an answer written on its own: bare math is read as LaTeX math."""
    prose = any(w.lower() not in _MATH_WORDS for w in re.findall(r"(?<!\\)\b[A-Za-z]{2,}\b", text))
    return parse_answer(text) if prose or text.startswith(("$", "\\")) else parse_answer(f"${text}$")


def _number(canonical: str | None) -> tuple[str, Any] | None:
    import sympy

    return None if canonical is None else (canonical, sympy.Rational(canonical))


def read_value(value: str, boxed: bool) -> tuple[str, Any] | None:
    """(canonical, value) of a marked answer that is not one number, by math-verify. Unbounded in time
    on hostile text: callers go through ``corl.tasks.bounded`` (a worker process with a budget)."""
    expr = parse_answer(f"\\boxed{{{value}}}") if boxed else _parse_written(value)
    return None if expr is None else (_canonical(expr), expr)


def verify_value(gold: str, predicted: Any) -> bool:
    """math-verify's equivalence of a data set's canonical answer and a read value (through ``bounded``)."""
    from math_verify import verify

    gold_expr = gold_value(gold)
    if gold_expr is None:
        return False
    try:
        return bool(verify(gold_expr, predicted, timeout_seconds=None))
    except Exception:
        return False


@functools.lru_cache(maxsize=4096)
def gold_value(canonical: str) -> Any | None:
    """The value of a data set's canonical answer. It is sympy's own string (``(n + 1)**(n - 1)``), so
    sympy reads it back: read as LaTeX, ``**`` made that answer 1 (and ``1`` graded right). Only data set
    answers (the operator's files) come here; a model's answer is never ``eval``-parsed."""
    import sympy

    try:
        return sympy.parse_expr(canonical)
    except Exception:  # not sympy's syntax (a set, an interval written by hand): read it as LaTeX
        return parse_answer(f"${canonical}$")


@dataclass(frozen=True)
class MathTask(FromData, OneByOne, Verdicts):
    name: str = "math"
    suggested_source: ClassVar[str] = "packaged:gsm8k"
    runs_code: ClassVar[bool] = False
    max_tokens: int = 256  # GSM8K solutions run 100-250 tokens (and the server default bound is 256)
    correct_token: str = "Yes"
    incorrect_token: str = "No"

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat(
            chat=True,
            system="Solve the problem step by step. Then write the final answer, a number or expression "
            "without units, on its own last line in the form: #### <answer>",
            # Members without a chat template are base models: one worked example shows the form.
            template="{system}\n\n" + _SHOT + "Question: {prompt}\nAnswer:",
        )

    @property
    def stop(self) -> tuple[str, ...]:
        # A base model continuing the plain template starts the next question.
        return ("\nQuestion:", "\n\n\n\n")

    def example(self, record: Mapping[str, Any]) -> Example:
        prompt, answer = record_fields(record)
        return Example(prompt, None if answer is None else canonical_answer(answer))

    def read(self, prompt: str, completion: str) -> tuple[str, Any] | None:
        """(canonical answer, its value) of what the completion states, never a value computed from its
        text: a marked answer (``\\boxed{}``, ``#### x``, "the answer is x") read by math-verify unless it
        is arithmetic still to do; unmarked, the last number written that is neither an operand nor
        restated from the prompt (``corl.tasks.literal``)."""
        text = _GSM8K_CALC.sub("", completion)[-_TAIL:]
        marked = marked_answer(text)
        if marked is None:
            return _number(literal.literal_answer(text, prompt))
        value = literal_span(marked[0])
        return None if value is None else self.read_marked(value, marked[1])

    def read_marked(self, value: str, boxed: bool) -> tuple[str, Any] | None:
        """A marked answer's value (no arithmetic left in it): one number, else a closed form by
        math-verify, in a worker process under a time budget."""
        number = literal.lone_number(value)
        if number is not None:
            return _number(number)
        read: tuple[str, Any] | None = bounded.call("read", value, boxed)
        return read

    def extract_answer(self, prompt: str, completion: str) -> str | None:
        read = self.read(prompt, completion)
        return None if read is None else read[0]

    def is_formatted(self, prompt: str, completion: str) -> bool:
        """In the asked form: a last line ``#### <answer>`` that reads as an answer."""
        lines = [line for line in completion.strip().splitlines() if line.strip()]
        return (
            bool(lines) and lines[-1].lstrip().startswith("####") and self.extract_answer(prompt, lines[-1]) is not None
        )

    def is_correct(self, example: Example, completion: str) -> bool:
        """Evaluation: math-verify's equivalence of the completion's answer and the data set's."""
        if example.answer is None:
            return False
        read = self.read(example.prompt, completion)
        if read is None:
            return False
        if read[0] == example.answer:
            return True
        if _NUMBER.fullmatch(read[0]) and _NUMBER.fullmatch(example.answer):
            return False  # two rationals in canonical form: equal exactly when their spellings are
        return bool(bounded.call("verify", example.answer, read[1]))

    def judge_prompt(self, prompt: str, response: str) -> str:
        return (
            f"Problem: {prompt}\n\nProposed solution: {response}\n\n"
            "Is the final answer of the proposed solution correct? Answer Yes or No: "
        )
