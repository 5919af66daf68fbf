"""Short-answer arithmetic and word problems (``task: arith``): the answer is one number, no working.

Small members cannot keep a worked solution on track for long, and most of their errors on easy
problems are in the arithmetic itself, the unit peers vote on. So the prompt asks for the number
alone: instruct members get it as a system message in their chat template; base members (no chat
template) get a few-shot plain template whose three questions and bare answers show the form. Answers are read
exactly as for ``math`` (``#### x``, "the answer is x", else the last number: SmolLM2 restates the
question before its answer), and canonicalised the same way, so ``-4``, ``-4.0`` and ``$-4$`` vote
together. Problems come from ``task.source``, e.g. ``gym:basic_arithmetic`` or ``gym:chain_sum``.
"""

from __future__ import annotations

from dataclasses import dataclass

from corl.proto import PromptFormat

from .math import MathTask

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
