"""Reading what a model *wrote*: literal numbers, never the value of an expression.

A reader that evaluates expressions grades a response that restates the question as right:
``"Calculate 61 * 41."`` would "answer" 2501. Models find that quickly (Gemma-3 learnt to answer
``8/2`` under a ground-truth reward read that way). So the readers here only ever take a number that
stands on its own in the text:

- a number is an *operand* when an arithmetic operator joins it to another number (``61 * 41``,
  ``8/2``, ``7-6``, ``4 * -83``); operands are never an answer;
- ``literal_answer`` is the last number in a text that is not an operand (``61 * 41 = 2501`` reads
  2501, what the model wrote after the sign; ``Calculate 61 * 41.`` reads nothing);
- ``reducible`` says whether an answer span holds arithmetic still to do (``8/2``, ``\\frac{6}{4}``,
  ``2 \\cdot 3``): a marked final answer (``\\boxed{}``, ``#### x``) that is reducible is no answer.

Pure functions, no sympy: cheap enough for every sample of every round.
"""

from __future__ import annotations

import re
from fractions import Fraction
from math import gcd

# A number as written: optional sign, digits with optional thousands separators, optional decimals.
NUMBER = re.compile(r"(?<![\w.,])(-?)(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(\.\d+)?(?!\d)")
# Binary operators between two numbers (plain text and LaTeX). "x" counts only between digits with spaces.
_OPERATOR = r"(?:\+|-|−|\*|×|÷|/|\\times|\\cdot|\\div|\s[x]\s)"
_BEFORE_OP = re.compile(_OPERATOR + r"\s*\(?\s*$")
_AFTER_OP = re.compile(r"^\s*\)?\s*" + _OPERATOR + r"\s*\(?\s*-?\d")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}")
_SLASH_FRAC = re.compile(r"(?<![\w.^])(-?\d+)\s*/\s*(\d+)(?![\w.^])")
_UNWRAP = re.compile(r"[$]|\\[,;!]|\\left|\\right")
_TEXT = re.compile(r"\\(?:text|mathrm|mbox)\{([^{}]*)\}")
_DIGIT_BEFORE = re.compile(r"[\d)]\s*$")
_TRAILING_PUNCT = " \t.!;"
_SPACES = re.compile(r"\s+")
RESTATED = 8  # characters either side of a number that, copied from the prompt, make it a restatement
_JOIN = re.compile(r"\s*" + _OPERATOR + r"\s*")
_SUM = re.compile(r"[-+−]")
_PRODUCT_GOES_ON = re.compile(r"\s*(?:[*/×÷]|\\times|\\cdot|\\div)")
_TERM_GOES_ON = re.compile(r"(?:\s*[\\^({]|[A-Za-z])")


def _unwrap(text: str) -> str:
    """Math delimiters and spacing commands dropped, ``\\text{...}`` replaced by its content."""
    return _UNWRAP.sub("", _TEXT.sub(r"\1", text))


def _sign_is_operator(text: str, start: int) -> bool:
    """A '-' right before a number is a binary minus when a number (or ')') comes before it."""
    return bool(_DIGIT_BEFORE.search(text[:start]))


def _is_operand(text: str, m: re.Match[str]) -> bool:
    start = m.start() if not (m.group(1) and _sign_is_operator(text, m.start())) else m.start() + 1
    before, after = text[max(0, start - 24) : start], text[m.end() : m.end() + 24]
    if _BEFORE_OP.search(before) and _DIGIT_BEFORE.search(_BEFORE_OP.sub("", before)):
        return True
    if m.group(1) and start != m.start():  # "7 -6": the minus joins it to the 7
        return True
    return bool(_AFTER_OP.match(after))


def numbers(text: str) -> list[tuple[str, bool]]:
    """Every number written in ``text``, in order, with whether it is an operand of an expression."""
    out = []
    for m in NUMBER.finditer(text):
        value = m.group(0)
        if m.group(1) and _sign_is_operator(text, m.start()):
            value = value[1:]
        out.append((value, _is_operand(text, m)))
    return out


def canonical_number(written: str) -> str:
    """``-4.0`` -> ``-4``, ``1,000`` -> ``1000``, ``0.50`` -> ``1/2``: one spelling per value, the same
    as the math reader's canonical form (sympy's rational string), so equal values vote together."""
    value = Fraction(written.replace(",", ""))
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def literal_answer(text: str, prompt: str = "") -> str | None:
    """The last number in ``text`` that is not an operand, canonical; None when there is none. With the
    ``prompt``, a number inside a stretch copied from it (``RESTATED`` characters either side) is the
    question restated, not an answer ("He kept 5 lollipops" from a prompt that says so)."""
    free = [
        value
        for m, (value, operand) in zip(NUMBER.finditer(text), numbers(text), strict=True)
        if not operand and not (prompt and _restated(text, m, prompt))
    ]
    return canonical_number(free[-1]) if free else None


def _restated(text: str, m: re.Match[str], prompt: str) -> bool:
    before, after = text[max(0, m.start() - RESTATED) : m.start()], text[m.end() : m.end() + RESTATED]
    if len(before) < RESTATED and len(after) < RESTATED:
        return False  # too little text around it to call it a copy ("5" alone is an answer)
    window = _SPACES.sub(" ", before + m.group(0) + after)
    return window in _SPACES.sub(" ", prompt)


def lone_number(text: str) -> str | None:
    """The canonical number when ``text`` is one number and nothing else (a trailing full stop allowed)."""
    body = _unwrap(text).strip().rstrip(_TRAILING_PUNCT).strip()
    m = NUMBER.fullmatch(body)
    return canonical_number(body) if m else None


def reducible(span: str) -> bool:
    """Whether an answer span still holds arithmetic on numbers: two numbers joined by an operator, or a
    fraction not in lowest terms (``8/2``, ``\\frac{6}{4}``). Closed forms are not: ``1/2``,
    ``3 + 2\\sqrt{2}`` (the 2 belongs to the root), ``2^{10}``, ``x^2 + 1``."""
    text = _unwrap(span)
    for num, den in [*_LATEX_FRAC.findall(text), *_SLASH_FRAC.findall(text)]:
        n, d = int(num), int(den)
        if d in (0, 1) or gcd(n, d) != 1:
            return True
    text = _SLASH_FRAC.sub(
        "1", _LATEX_FRAC.sub("1", text)
    )  # a fraction in lowest terms is one value (1/2 + 1/3 still adds)
    found = list(NUMBER.finditer(text))
    for a, b in zip(found, found[1:], strict=False):
        b_start = b.start() + 1 if b.group(1) and _sign_is_operator(text, b.start()) else b.start()
        if not _JOIN.fullmatch(text[a.end() : b_start]):
            continue
        if text[: a.start()].rstrip().endswith(("^", "^{", "_", "_{")):  # an exponent is part of its term
            continue
        if _TERM_GOES_ON.match(text[b.end() :]):  # 2\sqrt{3}, 2^{10}, 2x: b is part of a larger term
            continue
        if _SUM.search(text[a.end() : b_start]) and _PRODUCT_GOES_ON.match(text[b.end() :]):
            continue  # 1 - 1/2^n: b belongs to the product after it (its own pair is checked next)
        return True
    return False
