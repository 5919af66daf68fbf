"""Server-sent events of a streamed OpenAI completion, sent as its tokens are decoded.

Each step of the ``TokenStream`` becomes one chunk per choice that sampled a token: the text that
became final (``StreamedText``) and, when asked for, the tokens' log-probs. Chat choices open with
a role chunk. When the generation ends, each choice's last chunk carries the rest of its text (the
completion's own, so the deltas join to exactly the non-streamed text) and its finish reason; then
come usage (``stream_options.include_usage``) and ``data: [DONE]``. An error after the first chunk
(the backend failed, the request timed out) ends the stream with one event in the shared error
shape, ``data: {"error": {"type", "message", "field"}}``, which OpenAI's clients raise, then
``data: [DONE]``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from corl.proto import ErrorDetail, ErrorResponse
from corl.proto.openai import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChoiceDelta,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    TextCompletion,
    TokenLogprob,
    Usage,
)
from corl.services.errors import ServiceError

from .backends.base import FinishReason, GenerateOutput, TokenDelta
from .streamed_text import StreamedText, token_name
from .token_stream import TokenStream

log = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"


def event(chunk: ChatCompletionChunk | TextCompletion | ErrorResponse) -> str:
    return f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"


def usage_of(out: GenerateOutput) -> Usage:
    prompt = sum(len(o.prompt_token_ids) for o in out.outputs)
    completion = sum(len(c.token_ids) for o in out.outputs for c in o.completions)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


@dataclass(frozen=True)
class Token:
    """A sampled token as a chunk's log-probs show it; ``offset``: where its text begins in the choice."""

    name: str
    logprob: float
    offset: int


class Chunks(Protocol):
    """The chunks of one route's stream (chat or text completions)."""

    def opening(self, index: int) -> str: ...
    def delta(self, index: int, text: str, tokens: list[Token]) -> str: ...
    def ending(self, index: int, text: str, finish_reason: FinishReason) -> str: ...
    def usage(self, usage: Usage) -> str: ...


@dataclass(frozen=True)
class ChatChunks:
    meta: dict[str, Any]

    def _chunk(self, choice: ChatChunkChoice) -> str:
        return event(ChatCompletionChunk(**self.meta, choices=[choice]))

    def opening(self, index: int) -> str:
        return self._chunk(ChatChunkChoice(index=index, delta=ChoiceDelta(role="assistant", content="")))

    def delta(self, index: int, text: str, tokens: list[Token]) -> str:
        content = [TokenLogprob(token=t.name, logprob=t.logprob, bytes=list(t.name.encode())) for t in tokens]
        logprobs = ChoiceLogprobs(content=content) if content else None
        return self._chunk(ChatChunkChoice(index=index, delta=ChoiceDelta(content=text), logprobs=logprobs))

    def ending(self, index: int, text: str, finish_reason: FinishReason) -> str:
        delta = ChoiceDelta(content=text) if text else ChoiceDelta()
        return self._chunk(ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason))

    def usage(self, usage: Usage) -> str:
        return event(ChatCompletionChunk(**self.meta, choices=[], usage=usage))


@dataclass(frozen=True)
class TextChunks:
    meta: dict[str, Any]
    prompt_chars: list[int]  # per choice: ``text_offset`` counts from the start of its prompt

    def _chunk(self, choice: CompletionChoice) -> str:
        return event(TextCompletion(**self.meta, choices=[choice]))

    def opening(self, index: int) -> str:
        return ""

    def delta(self, index: int, text: str, tokens: list[Token]) -> str:
        logprobs = None
        if tokens:
            start = self.prompt_chars[index]
            logprobs = CompletionLogprobs(
                tokens=[t.name for t in tokens],
                token_logprobs=[t.logprob for t in tokens],
                text_offset=[start + t.offset for t in tokens],
            )
        return self._chunk(CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=None))

    def ending(self, index: int, text: str, finish_reason: FinishReason) -> str:
        return self._chunk(CompletionChoice(index=index, text=text, finish_reason=finish_reason))

    def usage(self, usage: Usage) -> str:
        return event(TextCompletion(**self.meta, choices=[], usage=usage))


@dataclass
class StreamedChoices:
    """Turns a ``TokenStream`` into server-sent events; ``texts``: one ``StreamedText`` per choice
    (index ``prompt * n + choice``); ``tokenizer`` names the tokens when ``logprobs`` are asked for."""

    chunks: Chunks
    texts: list[StreamedText]
    tokenizer: Any
    logprobs: bool
    include_usage: bool

    async def events(self, stream: TokenStream) -> AsyncIterator[str]:
        try:
            if opening := "".join(self.chunks.opening(i) for i in range(len(self.texts))):
                yield opening
            async with contextlib.aclosing(stream.steps()) as steps:
                async for step in steps:
                    if deltas := "".join(self._delta(d) for d in step.deltas):
                        yield deltas
            assert stream.output is not None
            completions = [c for o in stream.output.outputs for c in o.completions]
            yield "".join(
                self.chunks.ending(i, self.texts[i].finish(c.text), c.finish_reason) for i, c in enumerate(completions)
            )
            if self.include_usage:
                yield self.chunks.usage(usage_of(stream.output))
        except ServiceError as err:
            log.warning("stream ended early: %s", err.message)
            yield event(ErrorResponse(error=ErrorDetail(type=err.type, message=err.message, field=err.field)))
        except Exception:
            log.exception("stream failed")
            yield event(ErrorResponse(error=ErrorDetail(type="internal", message="the stream failed")))
        yield DONE

    def _delta(self, delta: TokenDelta) -> str:
        text, tokens = self.texts[delta.index], []
        for token_id, logprob in zip(delta.token_ids, delta.logprobs, strict=True):
            if self.logprobs:
                tokens.append(Token(token_name(self.tokenizer, token_id), logprob, len(text.text)))
            text.add(token_id)
        released = text.release()
        return self.chunks.delta(delta.index, released, tokens) if released or tokens else ""
