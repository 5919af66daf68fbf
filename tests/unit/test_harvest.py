"""The harvest policy, redaction, the readers of logged traffic and the canary rule, as pure functions."""

from __future__ import annotations

import json
import random
import sys
import types

import pytest
from pydantic import ValidationError

from corl.config import HarvestConfig, RedactConfig
from corl.harvest import RedactionFailed, Redactor, conversation_of, entry_id, opted_in, sampled, too_large
from corl.harvest.canary import decide, trained_share
from corl.harvest.formats import read_openai_jsonl, read_otel_genai
from corl.proto.conversation import Conversation, Turn

SECRET = "sk-live-4f9a0c1d2e3b"


def chat(*turns: tuple[str, object], **extra: object) -> bytes:
    return json.dumps({"model": "a", "messages": [{"role": r, "content": c} for r, c in turns], **extra}).encode()


def test_opt_in_by_route_and_member() -> None:
    policy = HarvestConfig(routes=["chat"], members=["a"])
    assert opted_in(policy, "chat", "a")
    assert not opted_in(policy, "completions", "a")
    assert not opted_in(policy, "chat", "b")
    assert opted_in(HarvestConfig(routes=["chat", "completions"]), "completions", "anyone")
    assert not opted_in(HarvestConfig(enabled=False), "chat", "a")


def test_sampled_share_is_the_configured_fraction() -> None:
    rng = random.Random(0)
    draws = [sampled(HarvestConfig(sample=0.25), rng) for _ in range(20_000)]
    assert abs(sum(draws) / len(draws) - 0.25) < 0.01
    assert all(sampled(HarvestConfig(sample=1.0), rng) for _ in range(100))
    assert not any(sampled(HarvestConfig(sample=0.0), rng) for _ in range(100))


def test_a_chat_is_its_turns_with_system_text() -> None:
    body = chat(("developer", "Be brief."), ("user", "hi"), ("assistant", "hello"), ("user", "12+34="), tools=[{}])
    conv = conversation_of("chat", body)
    assert conv is not None
    assert [(t.role, t.content) for t in conv.messages] == [
        ("system", "Be brief."),
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "12+34="),
    ]
    assert conv.system == "Be brief." and conv.last_user == "12+34="
    parts = chat(("user", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]))
    assert conversation_of("chat", parts).last_user == "ab"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        chat(("user", [{"type": "image_url", "image_url": {"url": "x"}}])),  # not text
        chat(("user", "q"), ("tool", "result")),  # a tool turn
        chat(("user", "q"), ("assistant", "prefill")),  # no final user turn
        json.dumps({"model": "a"}).encode(),
    ],
)
def test_what_cannot_be_harvested(body: bytes) -> None:
    assert conversation_of("chat", body) is None


def test_completions_prompt_is_one_user_turn() -> None:
    conv = conversation_of("completions", json.dumps({"model": "a", "prompt": "12+34="}).encode())
    assert conv is not None and conv.turns() == [{"role": "user", "content": "12+34="}]
    assert conversation_of("completions", json.dumps({"model": "a", "prompt": ["a", "b"]}).encode()) is None


def test_size_bounds() -> None:
    conv = Conversation(messages=[Turn(role="user", content="x" * 100)])
    assert too_large(HarvestConfig(max_chars=99), conv)
    assert not too_large(HarvestConfig(max_chars=100), conv)
    assert too_large(HarvestConfig(max_messages=1), Conversation(messages=[conv.messages[0]] * 2))


def test_redaction_by_patterns_then_hook() -> None:
    module = types.ModuleType("corl_test_redact_hook")
    module.scrub = lambda text: text.replace("Alice", "<name>")  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        cfg = RedactConfig(patterns=[r"sk-live-\w+", r"\b\d{3}-\d{2}-\d{4}\b"], hook=f"{module.__name__}:scrub")
        conv = Conversation(
            messages=[
                Turn(role="system", content=f"key {SECRET}"),
                Turn(role="user", content="Alice's SSN is 123-45-6789"),
            ]
        )
        red, n = Redactor(cfg)(conv)
    finally:
        del sys.modules[module.__name__]
    text = red.encode()
    assert SECRET not in text and "123-45-6789" not in text and "Alice" not in text
    assert red.messages[1].content == "<name>'s SSN is [REDACTED]"
    assert n == 3  # two pattern spans and one hook change
    assert Redactor(RedactConfig())(conv) == (conv, 0)


def test_a_failing_hook_stores_nothing() -> None:
    def boom(text: str) -> str:
        raise RuntimeError(text)  # the text must not surface in the error

    conv = Conversation(messages=[Turn(role="user", content=SECRET)])
    with pytest.raises(RedactionFailed) as err:
        Redactor(RedactConfig(), hook=boom)(conv)
    assert SECRET not in str(err.value)
    with pytest.raises(RedactionFailed):
        Redactor(RedactConfig(), hook=lambda t: None)(conv)  # type: ignore[arg-type,return-value]


def test_redact_config_refuses_bad_patterns_and_hook_names() -> None:
    with pytest.raises(ValidationError, match=r"patterns\[0\]"):
        RedactConfig(patterns=["(unclosed"])
    with pytest.raises(ValidationError):
        RedactConfig(hook="not a hook")
    with pytest.raises(ValueError, match="cannot be loaded"):
        Redactor(RedactConfig(hook="corl_no_such_module:fn"))


def test_entry_id_is_stable_and_content_addressed() -> None:
    a = Conversation(messages=[Turn(role="user", content="q")])
    assert entry_id(a) == entry_id(Conversation.decode(a.encode())) and len(entry_id(a)) == 16
    assert entry_id(a) != entry_id(Conversation(messages=[Turn(role="user", content="q2")]))


def test_openai_jsonl_reader() -> None:
    lines = [
        json.dumps({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]}),
        json.dumps({"request": {"model": "m", "messages": [{"role": "user", "content": "q2"}]}, "response": {}}),
        json.dumps({"custom_id": "x", "body": {"model": "m", "messages": [{"role": "user", "content": "q3"}]}}),
        json.dumps({"model": "m", "prompt": "q4"}),
        "",
        "{broken",
        json.dumps({"model": "m", "messages": [{"role": "tool", "content": SECRET}]}),
    ]
    read = read_openai_jsonl(lines)
    assert [c.last_user for c in read.conversations] == ["q1", "q2", "q3", "q4"]
    assert read.conversations[0].system == "s"
    assert read.skipped == ["line 6", "line 7"]


def _otlp(*spans: dict) -> dict:
    return {"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}


def _attr(key: str, value: str) -> dict:
    return {"key": key, "value": {"stringValue": value}}


def test_otel_genai_reader_reads_each_convention() -> None:
    messages = [{"role": "user", "parts": [{"type": "text", "content": "q1"}]}]
    new = {
        "name": "chat m",
        "attributes": [
            _attr("gen_ai.operation.name", "chat"),
            _attr("gen_ai.input.messages", json.dumps(messages)),
            _attr("gen_ai.system_instructions", json.dumps([{"type": "text", "content": "be brief"}])),
        ],
    }
    events = {
        "name": "chat m",
        "attributes": [_attr("gen_ai.system", "openai")],
        "events": [
            {"name": "gen_ai.system.message", "attributes": [_attr("content", "sys")]},
            {"name": "gen_ai.user.message", "attributes": [_attr("content", "q2")]},
        ],
    }
    indexed = {
        "name": "openai.chat",
        "attributes": [_attr("gen_ai.prompt.0.role", "user"), _attr("gen_ai.prompt.0.content", "q3")],
    }
    http = {"name": "GET /", "attributes": [_attr("http.method", "GET")]}
    tool_only = {"name": "chat", "attributes": [_attr("gen_ai.input.messages", "[]")]}
    read = read_otel_genai(json.dumps(_otlp(new, events, indexed, http, tool_only)))
    assert [(c.system, c.last_user) for c in read.conversations] == [("be brief", "q1"), ("sys", "q2"), (None, "q3")]
    assert read.skipped == ["span 4"]
    # a collector's file exporter: one document per line
    lines = "\n".join(json.dumps(_otlp(s)) for s in (new, indexed))
    assert [c.last_user for c in read_otel_genai(lines).conversations] == ["q1", "q3"]


@pytest.mark.parametrize(
    ("readings", "decision"),
    [
        ({1: 0.5, 2: 0.6}, "promote"),
        ({1: 0.5, 2: 0.5}, "promote"),
        ({1: 0.5, 2: 0.45}, "rollback"),
        ({1: 0.5}, "wait"),  # the candidate not read yet
        ({2: 0.9}, "wait"),  # the serving version never read
    ],
)
def test_canary_decision(readings: dict[int, float], decision: str) -> None:
    assert decide(readings, serving=1, candidate=2, tolerance=0.0) == decision


def test_canary_tolerance_and_traffic_share() -> None:
    assert decide({1: 0.5, 2: 0.45}, 1, 2, tolerance=0.05) == "promote"
    assert decide({1: 0.5}, 1, 1, tolerance=0.0) == "wait"
    assert trained_share(1, 2, frozenset(), 0.1, n_trained=1, n_all=2) == 0.1  # a candidate: the canary share
    assert trained_share(1, 2, frozenset({2}), 0.1, n_trained=1, n_all=2) == 0.0  # rolled back
    assert trained_share(2, 2, frozenset(), 0.1, n_trained=1, n_all=3) == pytest.approx(1 / 3)  # all serving
    assert trained_share(1, 2, frozenset(), 0.1, n_trained=1, n_all=1) == 1.0  # nothing to hold it back with
