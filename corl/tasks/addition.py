"""Synthetic 2-digit addition: prompt ``"ab+cd="`` with zero-padded operands, answer the decimal sum."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from corl.proto import PromptFormat

from .base import Example, OneByOne, Splits, Verdicts, record_fields


@dataclass(frozen=True)
class AdditionTask(OneByOne, Verdicts):
    name: str = "addition"
    generates: ClassVar[bool] = True  # has its own problem generator (splits)
    runs_code: ClassVar[bool] = False
    max_tokens: int = 4  # a sum has at most 3 digits, then the end token
    n_warmup: int = 6000
    n_rl: int = 2000
    n_eval: int = 400
    # Judge template: "<prompt><response>?" followed by the verdict character.
    correct_token: str = "Y"
    incorrect_token: str = "N"

    @staticmethod
    def prompt(a: int, b: int) -> str:
        return f"{a:02d}+{b:02d}="

    def splits(self, seed: int = 0) -> Splits:
        pairs = [(a, b) for a in range(100) for b in range(100)]
        random.Random(seed).shuffle(pairs)
        need = self.n_eval + self.n_rl + self.n_warmup
        if need > len(pairs):
            raise ValueError(f"addition has {len(pairs)} distinct problems, asked for {need}")
        examples = [Example(self.prompt(a, b), str(a + b)) for a, b in pairs[:need]]
        ev, rl = examples[: self.n_eval], examples[self.n_eval : self.n_eval + self.n_rl]
        return Splits(warmup=examples[self.n_eval + self.n_rl :], rl=rl, eval=ev)

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat()  # the bare "ab+cd=": the members are trained on exactly this text

    @property
    def stop(self) -> tuple[str, ...]:
        return ()

    def extract_answer(self, prompt: str, completion: str) -> str | None:
        text = completion.strip()
        # isascii: str.isdigit also accepts other scripts' digits and superscripts (int('²') raises).
        if not text or not (text.isascii() and text.isdigit()) or len(text) > 3:
            return None
        return str(int(text))

    def is_formatted(self, prompt: str, completion: str) -> bool:
        return self.extract_answer(prompt, completion) is not None

    def is_correct(self, example: Example, completion: str) -> bool:
        return example.answer is not None and self.extract_answer(example.prompt, completion) == example.answer

    def example(self, record: Mapping[str, Any]) -> Example:
        prompt, answer = record_fields(record)
        return Example(prompt, None if answer is None else self.extract_answer(prompt, answer))

    def judge_prompt(self, prompt: str, response: str) -> str:
        return f"{prompt}{response}?"
