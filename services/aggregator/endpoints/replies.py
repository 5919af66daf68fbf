"""Reading an outside endpoint's reply: only the fields corl uses, everything else ignored.

These are readers of someone else's contract, not corl's own wire models: vLLM, SGLang, Ollama and
hosted APIs each add fields of their own, so unknown fields are ignored here where corl's models
refuse them. A reply that is not JSON or has no ``choices`` list is unreadable (``None``); a choice
without text is a sample with no answer; a missing choice is one too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, ValidationError

from corl.proto import EndpointApi, FinishReason, VerdictSource


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Usage(_Lenient):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Candidate(_Lenient):
    token: str
    logprob: float


class _ChatToken(_Lenient):
    token: str = ""
    logprob: float | None = None
    top_logprobs: list[_Candidate] | None = None


class _ChatLogprobs(_Lenient):
    content: list[_ChatToken] | None = None


class _Message(_Lenient):
    content: str | None = None


class _Choice(_Lenient):
    """What a choice of either API carries besides its text and log-probs."""

    index: int = 0
    finish_reason: str | None = None


class _ChatChoice(_Choice):
    message: _Message | None = None
    logprobs: _ChatLogprobs | None = None


class _TextLogprobs(_Lenient):
    tokens: list[str] | None = None
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None


class _TextChoice(_Choice):
    text: str | None = None
    logprobs: _TextLogprobs | None = None


class _Reply(_Lenient):
    usage: _Usage | None = None


class _ChatReply(_Reply):
    choices: list[_ChatChoice]


class _TextReply(_Reply):
    choices: list[_TextChoice]


@dataclass(frozen=True)
class Choice:
    """One choice as corl reads it."""

    text: str | None  # None: no usable content
    finish_reason: FinishReason
    # Per generated token: candidate text -> log-prob (the sampled token and the top ones), when returned.
    candidates: list[dict[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Reply:
    choices: list[Choice]  # in index order
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def take(self, n: int) -> list[Choice | None]:
        """The first ``n`` choices; ``None`` where the reply has fewer."""
        return [*self.choices[:n], *[None] * (n - len(self.choices))]


def read_reply(api: EndpointApi, raw: bytes) -> Reply | None:
    """The reply's choices and usage; ``None`` when it is not a readable completion."""
    try:
        if api == "openai-chat":
            chat = _ChatReply.model_validate_json(raw)
            choices = [_chat_choice(c) for c in sorted(chat.choices, key=lambda c: c.index)]
            usage = chat.usage
        else:
            plain = _TextReply.model_validate_json(raw)
            choices = [_text_choice(c) for c in sorted(plain.choices, key=lambda c: c.index)]
            usage = plain.usage
    except ValidationError:
        return None
    usage = usage or _Usage()
    return Reply(choices, usage.prompt_tokens, usage.completion_tokens)


def _finish(reason: str | None) -> FinishReason:
    return "length" if reason == "length" else "stop"


def _chat_choice(c: _ChatChoice) -> Choice:
    tokens = (c.logprobs.content if c.logprobs else None) or []
    candidates = []
    for t in tokens:
        cands = {x.token: x.logprob for x in t.top_logprobs or []}
        if t.logprob is not None:
            cands.setdefault(t.token, t.logprob)
        candidates.append(cands)
    return Choice(c.message.content if c.message else None, _finish(c.finish_reason), candidates)


def _text_choice(c: _TextChoice) -> Choice:
    lp = c.logprobs
    candidates: list[dict[str, float]] = []
    if lp is not None:
        tops = lp.top_logprobs or []
        sampled = list(zip(lp.tokens or [], lp.token_logprobs or [], strict=False))
        for i in range(max(len(tops), len(sampled))):
            cands = dict(tops[i] or {}) if i < len(tops) else {}
            if i < len(sampled) and sampled[i][1] is not None:
                cands.setdefault(sampled[i][0], float(sampled[i][1]))  # type: ignore[arg-type]
            candidates.append(cands)
    return Choice(c.text, _finish(c.finish_reason), candidates)


# --- verdicts (peer_judge) -----------------------------------------------------------------------


def _same(token: str, verdict: str) -> bool:
    return bool(token.strip()) and token.strip().lower() == verdict.strip().lower()


def logprob_verdict(candidates: Sequence[dict[str, float]], correct: str, incorrect: str) -> float | None:
    """P(correct) / (P(correct) + P(incorrect)) at the first generated token where either verdict is
    among the candidates (case and surrounding spaces ignored); ``None`` when neither ever is."""
    for cands in candidates:
        # A log-prob is finite and <= 0; an outside server's 1000 or Infinity is no probability (it
        # overflowed math.exp and stalled every judged round): such a candidate is ignored.
        valid = {tok: lp for tok, lp in cands.items() if math.isfinite(lp) and lp <= 0.0}
        p_yes = sum(math.exp(lp) for tok, lp in valid.items() if _same(tok, correct))
        p_no = sum(math.exp(lp) for tok, lp in valid.items() if _same(tok, incorrect))
        if p_yes + p_no > 0.0:
            return p_yes / (p_yes + p_no)
    return None


_WORD = re.compile(r"\W*(\w+)")


def text_verdict(text: str | None, correct: str, incorrect: str) -> float | None:
    """1.0 or 0.0 when the text's first word is a verdict (a one-letter verdict also matches a word it
    begins: "Yes" for "Y"); ``None`` otherwise."""
    m = _WORD.match(text or "")
    if m is None:
        return None
    word = m.group(1).lower()
    for verdict, score in ((correct, 1.0), (incorrect, 0.0)):
        v = verdict.strip().lower()
        if word == v or (len(v) == 1 and word.startswith(v)):
            return score
    return None


def verdict(choice: Choice | None, correct: str, incorrect: str) -> tuple[float | None, VerdictSource]:
    """A judge's score for one reply choice and where it was read from."""
    if choice is None:
        return None, "unread"
    score = logprob_verdict(choice.candidates, correct, incorrect)
    if score is not None:
        return score, "logprobs"
    score = text_verdict(choice.text, correct, incorrect)
    return (score, "text") if score is not None else (None, "unread")
