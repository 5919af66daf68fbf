"""The requests sent to an outside endpoint, built with corl's OpenAI request models.

A task prompt goes out the way its ``PromptFormat`` says: as chat messages (the system text, then the
prompt as the user's) on ``openai-chat`` when the task uses chat, else in the task's plain template
(the text of one user message on ``openai-chat``, the prompt itself on ``openai-completions``).
"""

from __future__ import annotations

from typing import Any

from corl.proto import EndpointApi, PromptFormat, SamplingSettings
from corl.proto.openai import ChatCompletionRequest, CompletionRequest

JUDGE_MAX_TOKENS = 4  # room for a leading space or newline before the verdict word
JUDGE_TOP_LOGPROBS = 20  # the most OpenAI's chat API returns; completions allow 5


def sample_body(
    api: EndpointApi, model: str, prompt: str, fmt: PromptFormat, sampling: SamplingSettings, n: int, seed: int | None
) -> bytes:
    """One request for ``n`` samples of ``prompt``, with the round's sampling settings."""
    common = {
        "model": model,
        "n": n,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
        "stop": list(sampling.stop) or None,
        "seed": seed,
    }
    return _body(api, prompt, fmt, common)


def judge_body(api: EndpointApi, model: str, text: str, fmt: PromptFormat, logprobs: bool) -> bytes:
    """One greedy request for a verdict on a judge text; with ``logprobs``, the top candidates of each token."""
    common: dict[str, Any] = {"model": model, "n": 1, "temperature": 0.0, "max_tokens": JUDGE_MAX_TOKENS}
    if logprobs and api == "openai-chat":
        common |= {"logprobs": True, "top_logprobs": JUDGE_TOP_LOGPROBS}
    elif logprobs:
        common["logprobs"] = 5
    return _body(api, text, fmt, common)


def _body(api: EndpointApi, prompt: str, fmt: PromptFormat, fields: dict[str, Any]) -> bytes:
    req: ChatCompletionRequest | CompletionRequest
    if api == "openai-chat":
        turns = fmt.messages(prompt) if fmt.chat else [{"role": "user", "content": fmt.plain(prompt)}]
        req = ChatCompletionRequest.model_validate({**fields, "messages": turns})
    else:
        req = CompletionRequest.model_validate({**fields, "prompt": fmt.plain(prompt)})
    # Only what was set: an outside server reads its own defaults for the rest.
    return req.model_dump_json(exclude_unset=True, exclude_none=True).encode()
