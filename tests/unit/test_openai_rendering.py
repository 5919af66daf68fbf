"""Chat rendering for the OpenAI routes and the cutting of a choice into streamed deltas."""

from __future__ import annotations

import pytest

from corl.models.tokenizer import build_char_tokenizer
from corl.services.model.backends.base import Completion
from corl.services.model.openai_serving import split_tokens
from corl.services.model.rendering import PromptRenderer

CHAT = [
    {"role": "developer", "content": "Answer with digits."},
    {"role": "user", "content": "12+34="},
    {"role": "assistant", "content": "46"},
    {"role": "user", "content": "1+1="},
]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_member_without_chat_template_gets_role_prefixed_lines() -> None:
    renderer = PromptRenderer(build_char_tokenizer())
    assert not renderer.has_chat_template
    text = renderer.render_messages(CHAT)
    assert text == "developer: Answer with digits.\nuser: 12+34=\nassistant: 46\nuser: 1+1=\nassistant:"


def test_member_with_chat_template_uses_it_and_maps_developer_to_system() -> None:
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    text = PromptRenderer(tok).render_messages(CHAT)
    assert text == "<|system|>Answer with digits.<|user|>12+34=<|assistant|>46<|user|>1+1=<|assistant|>"


def test_the_startup_line_says_which_rendering_a_member_uses() -> None:
    tok = build_char_tokenizer()
    assert PromptRenderer(tok).describe().startswith("no chat template: every prompt uses the task's plain template")
    tok.chat_template = TEMPLATE
    assert "use the tokenizer's chat template" in PromptRenderer(tok).describe()


def test_a_template_that_refuses_the_messages_is_a_value_error() -> None:
    tok = build_char_tokenizer()
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ValueError, match="roles must alternate"):
        PromptRenderer(tok).render_messages(CHAT)


@pytest.mark.parametrize(
    ("text", "extra", "finish"),
    [("46", "<eos>", "stop"), ("4", "6\n", "stop"), ("461", "", "length")],
)
def test_deltas_join_to_the_text_and_every_token_has_a_name(text: str, extra: str, finish: str) -> None:
    tok = build_char_tokenizer()
    ids = tok.encode(text + extra, add_special_tokens=False)  # end token or stop-string tokens after the text
    tokens = split_tokens(tok, Completion(text, ids, [-0.5] * len(ids), finish))  # type: ignore[arg-type]
    assert "".join(tokens.pieces) == text
    assert len(tokens.pieces) == len(tokens.names) == len(ids)
    assert tokens.pieces[: len(text)] == list(text)  # one character per token arrives as it is sampled


def test_without_a_tokenizer_the_text_arrives_in_the_first_delta() -> None:
    tokens = split_tokens(None, Completion("46", [5, 7, 1], [-0.1, -0.2, -0.3], "stop"))
    assert tokens.pieces == ["46", "", ""] and tokens.names == ["5", "7", "1"]
