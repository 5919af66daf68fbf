"""A vLLM request in and out: the sampling parameters it is sent with, and its outputs read into
the backend contract. A request's final output (``FINAL_ONLY``) and one put together from the deltas
a stream sends (``DELTA``) become ``PromptOutput``s the same way.

vLLM's outputs are read by attribute; vLLM is imported only to build its sampling parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from corl.services.errors import InvalidInputError

from .base import Completion, GenerateOutput, PromptOutput, SamplingParams


def sampling_params(params: SamplingParams, streamed: bool) -> Any:
    """vLLM's ``SamplingParams`` for ``params``; ``streamed``: the new tokens of each step, else only
    the final output."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind

    try:
        # vLLM refuses n > 1 when greedy; greedy samples are identical, so decode once and repeat.
        return VSamplingParams(
            n=1 if params.temperature == 0.0 else params.n,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=list(params.stop) or None,
            seed=params.seed,
            logprobs=0,
            detokenize=bool(params.stop),  # vLLM matches stop strings on its own detokenised text
            output_kind=RequestOutputKind.DELTA if streamed else RequestOutputKind.FINAL_ONLY,
        )
    except VLLMValidationError as err:  # e.g. vLLM caps temperature at 2: the caller's input, 422
        raise InvalidInputError(f"vLLM backend: {err}", getattr(err, "parameter", None) or "body") from None


def judge_params(correct: int, incorrect: int) -> Any:
    """vLLM's ``SamplingParams`` for a judge call: one greedy step, the two verdict tokens' log-probs."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        max_tokens=1,
        temperature=0.0,
        logprob_token_ids=[correct, incorrect],
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def judge_scores(finals: Sequence[Any], correct: int, incorrect: int) -> list[float]:
    """P(correct) / (P(correct) + P(incorrect)) of each judge call's next token."""
    scores = []
    for out in finals:
        step = out.outputs[0].logprobs[0]
        # = sigmoid(log P(c) - log P(i)): the softmax normaliser cancels; written to stay finite.
        diff = float(step[correct].logprob) - float(step[incorrect].logprob)
        scores.append(1.0 / (1.0 + math.exp(-diff)) if diff >= 0 else math.exp(diff) / (1.0 + math.exp(diff)))
    return scores


def sampled_logprobs(c: Any) -> list[float]:
    """The log-prob of each token of a vLLM ``CompletionOutput`` (or delta) under its sampling distribution."""
    return [float(step[t].logprob) for step, t in zip(c.logprobs, c.token_ids, strict=True)]


def completion(c: Any, tokenizer: Any, detokenized: bool) -> Completion:
    token_ids = [int(t) for t in c.token_ids]
    # With stop strings vLLM's text already ends before the stop string; its ids include it.
    text = c.text if detokenized else tokenizer.decode(token_ids, skip_special_tokens=True)
    return Completion(text, token_ids, sampled_logprobs(c), "stop" if c.finish_reason == "stop" else "length")


def generate_output(
    version: int, prompt_ids: Sequence[list[int]], finals: Sequence[Any], params: SamplingParams, tokenizer: Any
) -> GenerateOutput:
    """One ``PromptOutput`` per prompt from vLLM's final outputs (``.outputs``: its completions).
    Greedy requests were sent with n=1 (vLLM refuses greedy n > 1): their completion is repeated."""
    greedy = params.temperature == 0.0
    outputs = []
    for ids, out in zip(prompt_ids, finals, strict=True):
        completions = [completion(c, tokenizer, bool(params.stop)) for c in out.outputs]
        outputs.append(PromptOutput(list(ids), completions * params.n if greedy else completions))
    return GenerateOutput(version, outputs)


@dataclass
class _Parts:
    """One completion put together from its deltas, read like a final ``CompletionOutput``."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None


class Gathered:
    """A streamed request's completions put together from its ``DELTA`` outputs (each delta also
    handed to ``on_delta`` as it arrives), read like a final ``RequestOutput``."""

    def __init__(self, n: int, on_delta: Callable[[Any], None]) -> None:
        self.outputs = [_Parts() for _ in range(n)]
        self._on_delta = on_delta

    def add(self, out: Any) -> Gathered:
        for delta in out.outputs:  # with n > 1, the children that sampled this step
            parts = self.outputs[delta.index]
            parts.token_ids += delta.token_ids
            parts.logprobs += list(delta.logprobs or [])
            parts.text += delta.text
            parts.finish_reason = delta.finish_reason or parts.finish_reason
            self._on_delta(delta)
        return self
