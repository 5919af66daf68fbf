"""A streamed completion's text: released as its tokens arrive, never a character half-decoded nor a
piece of a stop string that later tokens complete, and joining to exactly the completion's text."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from corl.models.tokenizer import build_char_tokenizer
from corl.services.model.streamed_text import StreamedText, growing_tail


def _byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per UTF-8 byte (GPT-2's byte alphabet, no merges): "é" is two tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _stream(tok: Any, text: str, stop: tuple[str, ...] = ()) -> tuple[StreamedText, list[str]]:
    streamed, released = StreamedText(tok, stop), []
    for token_id in tok.encode(text, add_special_tokens=False):
        streamed.add(token_id)
        released.append(streamed.release())
    return streamed, released


def test_each_token_is_released_as_it_arrives() -> None:
    streamed, released = _stream(build_char_tokenizer(), "12+34=46")
    assert released == list("12+34=46")
    assert streamed.finish("12+34=46") == ""


def test_a_character_spread_over_tokens_is_released_once_complete() -> None:
    tok = _byte_tokenizer()
    streamed, released = _stream(tok, "né€!")
    assert len(released) == 7  # n, 2 bytes of é, 3 of €, !
    assert released == ["n", "", "é", "", "", "€", "!"]
    assert all("\ufffd" not in r for r in released)


@pytest.mark.parametrize(
    ("text", "stop", "released", "final", "rest"),
    [
        # "ab" could begin "abc" until "x" arrives: held back, then released.
        ("1abx", ("abc",), ["1", "", "", "abx"], "1abx", ""),
        # The stop string completes: what was held back is never sent, and nothing after it.
        ("1abc", ("abc",), ["1", "", "", ""], "1", ""),
        # Of two stop strings the first to occur ends the text; the longer one's start is held too.
        ("x=4=", ("=4", "4=5"), ["x", "", "", ""], "x", ""),
        # The text ends (length) on a held-back tail: the completion's text brings it.
        ("1ab", ("abc",), ["1", "", ""], "1ab", "ab"),
    ],
)
def test_a_tail_that_could_become_a_stop_string_waits(
    text: str, stop: tuple[str, ...], released: list[str], final: str, rest: str
) -> None:
    streamed, got = _stream(build_char_tokenizer(), text, stop)
    assert got == released
    assert streamed.finish(final) == rest
    assert "".join(got) + rest == final


def test_without_a_tokenizer_the_text_arrives_at_the_end() -> None:
    streamed = StreamedText(None, ())
    streamed.add(5)
    assert streamed.release() == ""
    assert streamed.finish("46") == "46"


@pytest.mark.parametrize(("text", "stop", "tail"), [("12ab", "abc", 2), ("12a", "abc", 1), ("12", "abc", 0)])
def test_growing_tail(text: str, stop: str, tail: int) -> None:
    assert growing_tail(text, stop) == tail
