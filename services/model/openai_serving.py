"""The OpenAI-compatible serving layer: chat and text completions over ``ModelServing``.

Requests go through the same bounds, context check, dynamic batcher and weight leases as
``/v1/generate`` (``ModelServing.sample``), so every choice of one response, streamed or not, comes
from one weight version. A stream is cut from the finished batch: the whole response is generated
first (any error is an ordinary HTTP error, before the stream starts), then sent as one chunk per
token, so a weight swap during a stream never changes the version the stream reports.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from corl.proto.openai import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceDelta,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    ModelCard,
    ModelList,
    TextCompletion,
    TokenLogprob,
    Usage,
    fingerprint,
)
from corl.services.errors import InvalidInputError, NotFoundError

from .backends.base import Completion, GenerateOutput, SamplingParams
from .serving import ModelServing


@dataclass(frozen=True)
class Tokens:
    """One choice cut into its sampled tokens: ``pieces`` (text deltas; they join to the choice's
    text, the end token and a stop string's tokens add nothing) and ``names`` (each token's own text,
    for log-probs)."""

    pieces: list[str]
    names: list[str]


_UNSPLIT = Tokens([], [])


def split_tokens(tokenizer: Any, completion: Completion) -> Tokens:
    """Deltas by decoding growing prefixes (multi-byte characters appear once complete), clipped to
    the final text, which excludes the end token and the stop string."""
    ids, text = completion.token_ids, completion.text
    if tokenizer is None or not ids:  # no tokenizer here: the whole text arrives at once
        return Tokens(([text] + [""] * (len(ids) - 1)) if ids else [], [str(i) for i in ids])
    pieces, done = [], 0
    for k in range(1, len(ids) + 1):
        prefix = str(tokenizer.decode(ids[:k], skip_special_tokens=True))
        upto = min(len(prefix), len(text))
        if upto > done and prefix[:upto] == text[:upto]:
            pieces.append(text[done:upto])
            done = upto
        else:
            pieces.append("")
    if pieces:
        pieces[-1] += text[done:]  # whatever decoding left out still arrives, so deltas join to text
    names = [str(tokenizer.decode([i], skip_special_tokens=False)) for i in ids]
    return Tokens(pieces, names)


def _token_logprobs(tokens: Tokens, logprobs: Sequence[float]) -> list[TokenLogprob]:
    return [
        TokenLogprob(token=name, logprob=lp, bytes=list(name.encode()))
        for name, lp in zip(tokens.names, logprobs, strict=True)
    ]


def _usage(out: GenerateOutput) -> Usage:
    prompt = sum(len(o.prompt_token_ids) for o in out.outputs)
    completion = sum(len(c.token_ids) for o in out.outputs for c in o.completions)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


@dataclass(frozen=True)
class Served:
    """A generated response and, when streamed, its server-sent events."""

    weight_version: int
    body: ChatCompletion | TextCompletion
    events: list[str] | None = None

    async def stream(self) -> AsyncIterator[str]:
        for event in self.events or []:
            yield event
        yield "data: [DONE]\n\n"


def _event(chunk: ChatCompletionChunk | TextCompletion) -> str:
    return f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"


class OpenAIServing:
    def __init__(self, serving: ModelServing) -> None:
        self.serving = serving
        self.created = int(time.time())

    @property
    def _name(self) -> str:
        return self.serving.backend.name

    def models(self) -> ModelList:
        self.serving.require_ready()
        return ModelList(data=[ModelCard(id=self._name, created=self.created)])

    def _check_model(self, model: str) -> None:
        if model != self._name:
            raise NotFoundError(f"model {model!r} is not served here; this server serves {self._name!r}", "model")

    def _room(self, text: str) -> int:
        """New tokens a chat gets when it names no limit: the server's bound, or what the context has left."""
        bound, backend = self.serving.settings.max_tokens, self.serving.backend
        if backend.max_context is None or backend.tokenizer is None:
            return bound
        used = len(backend.tokenizer(text, add_special_tokens=False)["input_ids"])
        return max(1, min(bound, backend.max_context - used))

    async def _sample(
        self, req: ChatCompletionRequest | CompletionRequest, texts: list[str], field: str, max_tokens: int
    ) -> tuple[GenerateOutput, list[list[Tokens]]]:
        params = SamplingParams(
            n=req.n,
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=tuple(req.stop_strings()),
            seed=req.seed,
        )
        out = await self.serving.sample(texts, params, field)
        wants_logprobs = req.logprobs if isinstance(req, ChatCompletionRequest) else req.logprobs is not None
        if not (req.stream or wants_logprobs):  # only streams and log-probs need the tokens' texts
            return out, [[_UNSPLIT for _ in o.completions] for o in out.outputs]
        tok = self.serving.detokenizer
        splits = await asyncio.to_thread(lambda: [[split_tokens(tok, c) for c in o.completions] for o in out.outputs])
        return out, splits

    def _meta(self, prefix: str, out: GenerateOutput) -> dict[str, Any]:
        return dict(
            id=f"{prefix}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self._name,
            system_fingerprint=fingerprint(out.weight_version),
        )

    # --- chat ---------------------------------------------------------------------------------
    async def chat(self, req: ChatCompletionRequest) -> Served:
        self._check_model(req.model)
        if req.top_logprobs:
            raise InvalidInputError(
                "top_logprobs > 0 is not served: this server returns the sampled token's log-prob only "
                "(logprobs: true with top_logprobs 0 or unset)",
                "top_logprobs",
            )
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            text = self.serving.renderer.render_messages(messages)
        except ValueError as err:
            raise InvalidInputError(str(err), "messages") from None
        out, splits = await self._sample(req, [text], "messages", req.token_budget() or self._room(text))
        meta, usage = self._meta("chatcmpl", out), _usage(out)
        completions, tokens = out.outputs[0].completions, splits[0]
        logprobs = [
            ChoiceLogprobs(content=_token_logprobs(t, c.logprobs)) if req.logprobs else None
            for t, c in zip(tokens, completions, strict=True)
        ]
        body = ChatCompletion(
            **meta,
            usage=usage,
            choices=[
                ChatChoice(
                    index=i, message=AssistantMessage(content=c.text), logprobs=lp, finish_reason=c.finish_reason
                )
                for i, (c, lp) in enumerate(zip(completions, logprobs, strict=True))
            ],
        )
        if not req.stream:
            return Served(out.weight_version, body)
        events = [
            e for i in range(len(completions)) for e in _chat_events(meta, i, completions[i], tokens[i], logprobs[i])
        ]
        if req.stream_options and req.stream_options.include_usage:
            events.append(_event(ChatCompletionChunk(**meta, choices=[], usage=usage)))
        return Served(out.weight_version, body, events)

    # --- text completions ---------------------------------------------------------------------
    async def complete(self, req: CompletionRequest) -> Served:
        self._check_model(req.model)
        if req.logprobs:
            raise InvalidInputError(
                "logprobs > 0 is not served: this server returns the sampled token's log-prob only (logprobs: 0)",
                "logprobs",
            )
        prompts = req.prompts()
        out, splits = await self._sample(req, prompts, "prompt", req.max_tokens)
        meta, usage = self._meta("cmpl", out), _usage(out)
        choices: list[CompletionChoice] = []
        events: list[str] = []
        for p, (prompt, o) in enumerate(zip(prompts, out.outputs, strict=True)):
            for j, (c, tokens) in enumerate(zip(o.completions, splits[p], strict=True)):
                index = p * req.n + j  # OpenAI's order: every choice of the first prompt first
                lp = _text_logprobs(tokens, c.logprobs, len(prompt)) if req.logprobs is not None else None
                choices.append(CompletionChoice(index=index, text=c.text, logprobs=lp, finish_reason=c.finish_reason))
                if req.stream:
                    events += _text_events(meta, index, c, tokens, lp)
        if req.stream and req.stream_options and req.stream_options.include_usage:
            events.append(_event(TextCompletion(**meta, choices=[], usage=usage)))
        body = TextCompletion(**meta, choices=choices, usage=usage)
        return Served(out.weight_version, body, events if req.stream else None)


def _text_logprobs(tokens: Tokens, logprobs: Sequence[float], start: int) -> CompletionLogprobs:
    """``text_offset``: where each token's text begins, counted from the start of the prompt."""
    offsets = [start + sum(len(piece) for piece in tokens.pieces[:k]) for k in range(len(tokens.pieces))]
    return CompletionLogprobs(tokens=tokens.names, token_logprobs=list(logprobs), text_offset=offsets)


def _chat_events(
    meta: dict[str, Any], index: int, c: Completion, tokens: Tokens, logprobs: ChoiceLogprobs | None
) -> list[str]:
    """One choice as chunks: the role, one chunk per sampled token (its text delta and log-prob),
    then the finish reason."""
    first = ChatChunkChoice(index=index, delta=ChoiceDelta(role="assistant", content=""))
    events = [_event(ChatCompletionChunk(**meta, choices=[first]))]
    for k, piece in enumerate(tokens.pieces):
        lp = ChoiceLogprobs(content=[logprobs.content[k]]) if logprobs and logprobs.content else None
        if piece or lp:
            delta = ChatChunkChoice(index=index, delta=ChoiceDelta(content=piece), logprobs=lp)
            events.append(_event(ChatCompletionChunk(**meta, choices=[delta])))
    last = ChatChunkChoice(index=index, delta=ChoiceDelta(), finish_reason=c.finish_reason)
    events.append(_event(ChatCompletionChunk(**meta, choices=[last])))
    return events


def _text_events(
    meta: dict[str, Any], index: int, c: Completion, tokens: Tokens, logprobs: CompletionLogprobs | None
) -> list[str]:
    """One choice as chunks: one per sampled token (its text and log-prob), then the finish reason."""
    events = []
    for k, piece in enumerate(tokens.pieces):
        lp = None
        if logprobs is not None:
            lp = CompletionLogprobs(
                tokens=[logprobs.tokens[k]],
                token_logprobs=[logprobs.token_logprobs[k]],
                text_offset=[logprobs.text_offset[k]],
            )
        if piece or lp:
            chunk = CompletionChoice(index=index, text=piece, logprobs=lp, finish_reason=None)
            events.append(_event(TextCompletion(**meta, choices=[chunk])))
    end = CompletionChoice(index=index, text="", finish_reason=c.finish_reason)
    events.append(_event(TextCompletion(**meta, choices=[end])))
    return events
