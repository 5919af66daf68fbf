"""Short-answer arithmetic and word problems (``task: arith``): the answer is one number, no working.

Small members cannot keep a worked solution on track for long, and most of their errors on easy
problems are in the arithmetic itself, the unit peers vote on. So the prompt asks for the number
alone: instruct members get it as a system message in their chat template; base members (no chat
template) get a few-shot plain template whose three questions and bare answers show the form.

The answer is a number the model *wrote* (``corl.tasks.literal``): the marked one (``#### x``, "the
answer is x", ``\\boxed{x}``) or else the last number in the text that is not an operand, canonical
so that ``-4``, ``-4.0`` and ``$-4$`` vote together. Nothing is evaluated: ``"Calculate 61 * 41."``,
``"61 * 41"`` and ``"8/2"`` have no answer (an earlier reader computed them, and models learnt to
restate the question). Problems come from ``task.source``, e.g. ``gym:basic_arithmetic``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corl.proto import PromptFormat

from . import literal
from .math import MathTask, _number

# Demonstrations for base models: fixed text, never a data set's own problems or answers.
SHOTS = (
    "Question: What is 3 + 4?\nAnswer: 7\n\n"
    "Question: Sam has 5 pens and gives away 2. How many pens does he have left?\nAnswer: 3\n\n"
    "Question: What is 6 * 3?\nAnswer: 18\n\n"
)


@dataclass(frozen=True)
class ArithTask(MathTask):
    name: str = "arith"
    max_tokens: int = 24  # a number, or a short sentence that ends in one

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat(
            chat=True,
            system="Answer with just the final number.",
            template=SHOTS + "Question: {prompt}\nAnswer:",
        )

    @property
    def stop(self) -> tuple[str, ...]:
        # A base model continuing the few-shot template starts the next question after a blank line.
        return ("\nQuestion:", "\n\n")

    def read_marked(self, value: str, boxed: bool) -> tuple[str, Any] | None:
        """Literal numbers only, never math-verify: LaTeX (``\\frac{1}{2}``) only when it wraps one
        number (no digits picked out of it), else the last number written that is not an operand."""
        return _number(literal.lone_number(value) if "\\" in value or "{" in value else literal.literal_answer(value))

    def is_formatted(self, prompt: str, completion: str) -> bool:
        """In the asked form: the number alone."""
        return literal.lone_number(completion) is not None
