"""Math word problems graded by ``math-verify``: answers are parsed and canonicalised, so that
``\\frac{1}{2}``, ``0.5`` and ``1/2`` count as the same vote."""

from __future__ import annotations

from dataclasses import dataclass

from corl.proto import PromptFormat

from .base import Example, Splits


@dataclass(frozen=True)
class MathTask:
    name: str = "math"
    max_tokens: int = 512
    correct_token: str = "Yes"
    incorrect_token: str = "No"

    def splits(self, seed: int = 0) -> Splits:
        raise NotImplementedError("math prompts come from a JSONL prompt source, not a generator")

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat(
            chat=True,
            system="Solve the problem step by step. End with: The answer is <number>.",
            template="{system}\n\nQuestion: {prompt}\nAnswer:",
        )

    @property
    def stop(self) -> tuple[str, ...]:
        return ()

    def extract_answer(self, prompt: str, completion: str) -> str | None:
        from math_verify import parse

        parsed = parse(completion, parsing_timeout=None)
        if not parsed:
            return None
        # math-verify returns [sympy expression, original string]; the expression's string form is canonical.
        return str(parsed[0])

    def is_correct(self, example: Example, completion: str) -> bool:
        return example.answer is not None and self.extract_answer(example.prompt, completion) == example.answer

    def judge_prompt(self, prompt: str, response: str) -> str:
        return f"Problem: {prompt}\nProposed solution: {response}\nIs the solution correct? Answer Yes or No: "

    @property
    def verdict_tokens(self) -> tuple[str, str]:
        return self.correct_token, self.incorrect_token
