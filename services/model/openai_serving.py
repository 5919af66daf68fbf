"""The OpenAI-compatible serving layer: chat and text completions over ``ModelServing``.

Requests go through the same bounds and context check as ``/v1/generate``, and every choice of one
response, streamed or not, comes from one weight version. A response that is not streamed goes
through the dynamic batcher (``ModelServing.sample``). A streamed one (``stream: true``) is its own
backend call that sends each token as it is decoded (``ModelServing.stream``, events in
``openai_stream``): it leases one weight version from its first token to its last, so a swap that
lands mid-stream changes neither its weights nor the version its chunks report. Anything that fails
before the first token is an ordinary HTTP error; a failure after it ends the stream with an error
event.
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
    ChatCompletion,
    ChatCompletionRequest,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    ModelCard,
    ModelList,
    TextCompletion,
    TokenLogprob,
    fingerprint,
)
from corl.services.errors import InvalidInputError, NotFoundError

from .backends.base import Completion, GenerateOutput, SamplingParams
from .openai_stream import ChatChunks, Chunks, StreamedChoices, TextChunks, usage_of
from .serving import ModelServing
from .streamed_text import StreamedText, token_name


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
    return Tokens(pieces, [token_name(tokenizer, i) for i in ids])


def _token_logprobs(tokens: Tokens, logprobs: Sequence[float]) -> list[TokenLogprob]:
    return [
        TokenLogprob(token=name, logprob=lp, bytes=list(name.encode()))
        for name, lp in zip(tokens.names, logprobs, strict=True)
    ]


@dataclass(frozen=True)
class Served:
    """A response: its whole body or, when streamed, its server-sent events."""

    weight_version: int
    body: ChatCompletion | TextCompletion | None = None
    events: AsyncIterator[str] | None = None


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

    @staticmethod
    def _params(req: ChatCompletionRequest | CompletionRequest, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            n=req.n,
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=tuple(req.stop_strings()),
            seed=req.seed,
        )

    async def _sample(
        self, texts: list[str], field: str, params: SamplingParams, logprobs: bool
    ) -> tuple[GenerateOutput, list[list[Tokens]]]:
        out = await self.serving.sample(texts, params, field)
        if not logprobs:  # only log-probs need the tokens' texts
            return out, [[_UNSPLIT for _ in o.completions] for o in out.outputs]
        tok = self.serving.detokenizer
        splits = await asyncio.to_thread(lambda: [[split_tokens(tok, c) for c in o.completions] for o in out.outputs])
        return out, splits

    async def _stream(
        self, req: ChatCompletionRequest | CompletionRequest, texts: list[str], field: str, params: SamplingParams
    ) -> Served:
        stream = await self.serving.stream(texts, params, field)
        meta = self._meta("chatcmpl" if isinstance(req, ChatCompletionRequest) else "cmpl", stream.weight_version)
        chunks: Chunks = (
            ChatChunks(meta)
            if isinstance(req, ChatCompletionRequest)
            else TextChunks(meta, [len(t) for t in texts for _ in range(req.n)])
        )
        tok = self.serving.detokenizer
        choices = StreamedChoices(
            chunks,
            [StreamedText(tok, params.stop) for _ in range(len(texts) * req.n)],
            tok,
            logprobs=_wants_logprobs(req),
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
        )
        return Served(stream.weight_version, events=choices.events(stream))

    def _meta(self, prefix: str, weight_version: int) -> dict[str, Any]:
        return dict(
            id=f"{prefix}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self._name,
            system_fingerprint=fingerprint(weight_version),
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
        params = self._params(req, req.token_budget() or self._room(text))
        if req.stream:
            return await self._stream(req, [text], "messages", params)
        out, splits = await self._sample([text], "messages", params, req.logprobs)
        meta, usage = self._meta("chatcmpl", out.weight_version), usage_of(out)
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
        return Served(out.weight_version, body)

    # --- text completions ---------------------------------------------------------------------
    async def complete(self, req: CompletionRequest) -> Served:
        self._check_model(req.model)
        if req.logprobs:
            raise InvalidInputError(
                "logprobs > 0 is not served: this server returns the sampled token's log-prob only (logprobs: 0)",
                "logprobs",
            )
        prompts = req.prompts()
        # An omitted max_tokens is OpenAI's default (16) lowered to this server's bound.
        given = "max_tokens" in req.model_fields_set
        max_tokens = req.max_tokens if given else min(req.max_tokens, self.serving.settings.max_tokens)
        params = self._params(req, max_tokens)
        if req.stream:
            return await self._stream(req, prompts, "prompt", params)
        out, splits = await self._sample(prompts, "prompt", params, _wants_logprobs(req))
        meta, usage = self._meta("cmpl", out.weight_version), usage_of(out)
        choices: list[CompletionChoice] = []
        for p, (prompt, o) in enumerate(zip(prompts, out.outputs, strict=True)):
            for j, (c, tokens) in enumerate(zip(o.completions, splits[p], strict=True)):
                index = p * req.n + j  # OpenAI's order: every choice of the first prompt first
                lp = _text_logprobs(tokens, c.logprobs, len(prompt)) if req.logprobs is not None else None
                choices.append(CompletionChoice(index=index, text=c.text, logprobs=lp, finish_reason=c.finish_reason))
        body = TextCompletion(**meta, choices=choices, usage=usage)
        return Served(out.weight_version, body)


def _wants_logprobs(req: ChatCompletionRequest | CompletionRequest) -> bool:
    return req.logprobs if isinstance(req, ChatCompletionRequest) else req.logprobs is not None


def _text_logprobs(tokens: Tokens, logprobs: Sequence[float], start: int) -> CompletionLogprobs:
    """``text_offset``: where each token's text begins, counted from the start of the prompt."""
    offsets = [start + sum(len(piece) for piece in tokens.pieces[:k]) for k in range(len(tokens.pieces))]
    return CompletionLogprobs(tokens=tokens.names, token_logprobs=list(logprobs), text_offset=offsets)
