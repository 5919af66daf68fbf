"""The text of one streamed completion as its tokens arrive, and how much of it is final.

A token is decoded in the context of the token before it (vLLM's and Hugging Face's incremental
detokenisation do the same), so a word's leading space or a character spread over several byte
tokens comes out as it does in the whole text, at a cost per token that does not grow with the
text. Text is *final* once no later token can change it: a character still missing bytes waits,
and so does a tail that could still grow into a stop string (it is sent once it cannot, or never,
when the stop string completes and the completion ends before it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

_INCOMPLETE = "\ufffd"  # what decoding shows for a character whose remaining bytes are still to come


def token_name(tokenizer: Any, token_id: int) -> str:
    """A token's own text (special tokens included), as log-probs name it; its id without a tokenizer."""
    return str(token_id) if tokenizer is None else str(tokenizer.decode([token_id], skip_special_tokens=False))


def growing_tail(text: str, stop: str) -> int:
    """Length of the longest end of ``text`` that is the start of ``stop`` (less than all of it)."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


class StreamedText:
    """``add`` each token as it is sampled; ``release`` what became final since the last call;
    ``finish`` with the completion's own text. Without a tokenizer nothing is final before ``finish``."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self._tokenizer, self._stop = tokenizer, tuple(stop)
        self._ids: list[int] = []
        self._start = self._read = 0  # tokens [start, read) are the context the next ones are decoded in
        self.text = ""  # decoded so far, whole characters only
        self.sent = ""  # released so far

    def add(self, token_id: int) -> None:
        self._ids.append(token_id)
        if self._tokenizer is None:
            return
        context = self._decode(self._ids[self._start : self._read])
        decoded = self._decode(self._ids[self._start :])
        if decoded.endswith(_INCOMPLETE):
            return
        self.text += decoded[len(context) :]
        self._start, self._read = self._read, len(self._ids)

    def release(self) -> str:
        end = len(self.text)
        for stop in self._stop:
            at = self.text.find(stop)
            end = min(end, at if at >= 0 else end, len(self.text) - growing_tail(self.text, stop))
        new = self.text[len(self.sent) : end]
        self.sent += new
        return new

    def finish(self, text: str) -> str:
        """The rest of the completion's ``text``: the deltas join to exactly it."""
        if not text.startswith(self.sent):  # a tokenizer whose pieces decode differently in context
            log.warning("streamed %d characters that the completion's text does not begin with", len(self.sent))
            return ""
        rest, self.sent = text[len(self.sent) :], text
        return rest

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True)) if ids else ""
