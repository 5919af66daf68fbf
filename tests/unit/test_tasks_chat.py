"""The free-form chat task: conversations as prompts, every member's rendering of them, short answers
that vote, the judge text with the config's rubric, and no reward for restating the question."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from corl.config import TaskConfig
from corl.proto import GradeRequest, PromptFormat
from corl.proto.conversation import Conversation, Turn
from corl.services.aggregator.endpoints.bodies import sample_body
from corl.services.model.rendering import PromptRenderer
from corl.tasks import get_task, reads_rubric
from corl.tasks.chat import DEFAULT_RUBRIC, ChatTask, canonical
from corl.tasks.echo import echoes

CONV = Conversation(
    messages=[
        Turn(role="system", content="You answer with one word."),
        Turn(role="user", content="Capital of France?"),
    ]
)
PROMPT = CONV.encode()


def test_the_task_is_registered_and_reads_a_rubric() -> None:
    task = get_task("chat")
    assert isinstance(task, ChatTask) and task.rubric == DEFAULT_RUBRIC
    assert get_task("chat", "Be exact.").rubric == "Be exact."  # type: ignore[attr-defined]
    assert reads_rubric("chat") and not reads_rubric("math")
    with pytest.raises(ValueError, match="reads no rubric"):
        get_task("math", "anything")
    assert TaskConfig(name="chat", rubric="Be exact.").rubric == "Be exact."
    with pytest.raises(ValidationError, match="reads no rubric"):
        TaskConfig(name="addition", rubric="Be exact.")


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        (" Paris.", "paris"),
        ('"PARIS"', "paris"),
        ("1,000", "1000"),
        ("46.0", "46"),
        ("Paris\nis the capital", None),  # not one line: free-form, judged only
        ("x" * 41, None),  # too long to vote
        ("12+34", None),  # arithmetic still to do
        ("capital of france?", None),  # restates the question
        ("you answer with one word", None),  # restates the system text
        ("   ", None),
    ],
)
def test_short_answers_vote_and_echoes_do_not(completion: str, answer: str | None) -> None:
    assert get_task("chat").extract_answer(PROMPT, completion) == answer


def test_no_echo_is_graded_correct() -> None:
    task = get_task("chat")
    example = task.example({"messages": CONV.turns(), "answer": "Paris"})
    assert example.prompt == PROMPT and example.answer == "paris"
    assert task.is_correct(example, "Paris")
    assert not any(task.is_correct(example, e) for e in [*echoes(example.prompt), "Capital of France?"])


def test_records_become_conversations() -> None:
    task = get_task("chat")
    assert Conversation.decode(task.example({"prompt": "hi"}).prompt).turns() == [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="end with a user turn"):
        task.example({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})


def test_judge_text_holds_the_rubric_the_conversation_and_the_response() -> None:
    text = get_task("chat", "Only the city name.").judge_prompt(PROMPT, "Paris")
    assert text.startswith("Rubric: Only the city name.")
    assert "system: You answer with one word.\nuser: Capital of France?\n" in text
    assert "Response: Paris" in text and text.endswith("Answer Y or N: ")
    assert get_task("chat").verdict_tokens == ("Y", "N")
    assert GradeRequest(items=[{"prompt": PROMPT, "response": "x"}], task="chat", rubric="r").rubric == "r"


class _ChatTokenizer:
    chat_template = "x"
    bos_token_id = None

    def apply_chat_template(self, messages: list, tokenize: bool, add_generation_prompt: bool) -> str:
        return "|".join(f"{m['role']}={m['content']}" for m in messages) + "|>"


def test_every_member_renders_the_conversation_its_own_way() -> None:
    fmt = get_task("chat").prompt_format
    assert fmt.conversation and fmt.chat
    assert PromptRenderer(_ChatTokenizer()).render(PROMPT, fmt) == (
        "system=You answer with one word.|user=Capital of France?|>"
    )
    plain = PromptRenderer(None).render(PROMPT, fmt)
    assert plain == "system: You answer with one word.\nuser: Capital of France?\nassistant:"
    # An outside endpoint gets the turns as its messages.
    from corl.proto import SamplingSettings

    body = sample_body("openai-chat", "m", PROMPT, fmt, SamplingSettings(), 1, None)
    assert b'"messages":[{"role":"system"' in body and b"Capital of France?" in body
    # The task's own system text applies only to a conversation without one; judge texts are plain.
    with_system = PromptFormat(chat=True, conversation=True, system="default")
    bare = Conversation(messages=[Turn(role="user", content="q")]).encode()
    assert with_system.messages(bare)[0] == {"role": "system", "content": "default"}
    assert with_system.messages(PROMPT)[0]["content"] == "You answer with one word."
    assert not with_system.judging().conversation
    with pytest.raises(ValueError, match="not a conversation"):
        fmt.messages("plain text")


def test_canonical_forms() -> None:
    assert canonical("  Hello   World. ") == "hello world"
    assert canonical("-3") == "-3" and canonical("3.50") == "3.5"
