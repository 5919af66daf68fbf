"""The model server's context-length check: a byte bound skips the tokenizer when prompts surely
fit, and the tokenizer decides when they might not."""

from __future__ import annotations

from collections.abc import Sequence

from corl.services.model.backends.base import first_too_long


class CountingTokenizer:
    """Two tokens per character (worse than any real tokenizer's bound), counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, texts: Sequence[str], add_special_tokens: bool) -> dict[str, list[list[int]]]:
        self.calls += 1
        return {"input_ids": [[0] * (2 * len(t)) for t in texts]}


def test_short_prompts_skip_the_tokenizer() -> None:
    tok = CountingTokenizer()
    assert first_too_long(tok, ["12+34=", "99+99="], 8, 64) is None
    assert tok.calls == 0


def test_prompts_near_the_limit_are_tokenised_and_the_first_offender_named() -> None:
    tok = CountingTokenizer()
    # 30 bytes + 1 + 8 > 32: might not fit, so the tokenizer counts (60 tokens here).
    assert first_too_long(tok, ["1+1=", "x" * 30, "y" * 30], 8, 32) == 1
    assert tok.calls == 1


def test_multibyte_text_counts_bytes_not_characters() -> None:
    tok = CountingTokenizer()
    # 10 characters but 30 UTF-8 bytes: 30 + 1 + 4 > 32, so the tokenizer is asked (20 tokens: fits).
    assert first_too_long(tok, ["数" * 10], 4, 32) is None
    assert tok.calls == 1


def test_no_limit_or_no_tokenizer_means_no_check() -> None:
    assert first_too_long(None, ["x" * 10_000], 8, 64) is None
    assert first_too_long(CountingTokenizer(), ["x" * 10_000], 8, None) is None
