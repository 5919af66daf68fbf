"""Readers of logged traffic (``corl data import``): each yields the conversations a log holds, in the
shape the gateway harvests (``corl.proto.Conversation``, ending with the user turn that was answered).

- ``openai-jsonl``: one JSON object per line, a chat-completions request body (``{"model", "messages"}``),
  a logged pair (``{"request": {...}, "response": {...}}``) or an OpenAI batch line (``{"body": {...}}``);
  a text completion's ``prompt`` is one user turn.
- ``otel-genai``: OpenTelemetry GenAI spans exported as JSON (an OTLP export, ``{"resourceSpans": ...}``,
  one per line or one document, or a list of spans). Each span's input is read from whichever
  convention it carries: ``gen_ai.input.messages`` (with ``gen_ai.system_instructions``), message events
  (``gen_ai.user.message``, ...) or indexed ``gen_ai.prompt.<i>.role/content`` attributes.

A line or span that holds no conversation is counted as skipped, with its line or span number; nothing
it contained is echoed (it may hold what redaction is there to remove).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from corl.proto.conversation import Conversation

from .policy import conversation_of

ImportFormat = Literal["openai-jsonl", "otel-genai"]
_EVENT_ROLES = {f"gen_ai.{r}.message": r for r in ("system", "user", "assistant")}


@dataclass
class Read:
    """What a log yielded: its conversations and where the rest was skipped."""

    conversations: list[Conversation] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "line 7", "span 3": no conversation there


def _conversation(turns: list[dict[str, str]]) -> Conversation | None:
    body = json.dumps({"messages": turns}).encode()
    return conversation_of("chat", body)


def read_openai_jsonl(lines: Iterable[str]) -> Read:
    out = Read()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            out.skipped.append(f"line {n}")
            continue
        body = (obj.get("request") or obj.get("body") or obj) if isinstance(obj, dict) else None
        conv = None
        if isinstance(body, dict):
            raw = json.dumps(body).encode()
            conv = conversation_of("chat", raw) if "messages" in body else conversation_of("completions", raw)
        if conv is None:
            out.skipped.append(f"line {n}")
        else:
            out.conversations.append(conv)
    return out


# --- OpenTelemetry GenAI ------------------------------------------------------------------------------


def _value(v: Any) -> Any:
    """An OTLP JSON ``AnyValue`` (``{"stringValue": ...}``, ``{"arrayValue": {"values": [...]}}``) as plain data."""
    if not isinstance(v, Mapping):
        return v
    for key in ("stringValue", "boolValue", "intValue", "doubleValue"):
        if key in v:
            return v[key]
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return _attributes(v["kvlistValue"].get("values", []))
    return v


def _attributes(attrs: Any) -> dict[str, Any]:
    """Attributes as a dict, from the OTLP list of ``{"key", "value"}`` or a plain mapping."""
    if isinstance(attrs, Mapping):
        return dict(attrs)
    if isinstance(attrs, list):
        return {a["key"]: _value(a.get("value")) for a in attrs if isinstance(a, Mapping) and "key" in a}
    return {}


def _json_attr(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return value


def _parts_text(parts: Any) -> str | None:
    if not isinstance(parts, list):
        return None
    texts = [p.get("content") for p in parts if isinstance(p, Mapping)]
    if any(p.get("type") != "text" for p in parts if isinstance(p, Mapping)) or not all(
        isinstance(t, str) for t in texts
    ):
        return None
    return "".join(texts)  # type: ignore[arg-type]


def _from_input_messages(attrs: dict[str, Any]) -> list[dict[str, str]] | None:
    messages = _json_attr(attrs.get("gen_ai.input.messages"))
    if not isinstance(messages, list):
        return None
    turns = []
    system = _json_attr(attrs.get("gen_ai.system_instructions"))
    if system is not None:
        text = _parts_text(system)
        if text is None:
            return None
        turns.append({"role": "system", "content": text})
    for m in messages:
        text = _parts_text(m.get("parts")) if isinstance(m, Mapping) else None
        if text is None:
            return None
        turns.append({"role": str(m.get("role")), "content": text})
    return turns


def _from_events(span: Mapping[str, Any]) -> list[dict[str, str]] | None:
    turns = []
    for event in span.get("events") or []:
        role = _EVENT_ROLES.get(event.get("name", "")) if isinstance(event, Mapping) else None
        if role is None:
            continue
        content = _attributes(event.get("attributes")).get("content")
        if not isinstance(content, str):
            return None
        turns.append({"role": role, "content": content})
    return turns or None


def _from_indexed(attrs: dict[str, Any]) -> list[dict[str, str]] | None:
    turns = []
    i = 0
    while f"gen_ai.prompt.{i}.role" in attrs:
        content = attrs.get(f"gen_ai.prompt.{i}.content")
        if not isinstance(content, str):
            return None
        turns.append({"role": str(attrs[f"gen_ai.prompt.{i}.role"]), "content": content})
        i += 1
    return turns or None


def _spans(doc: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(doc, list):
        for item in doc:
            yield from _spans(item)
    elif isinstance(doc, Mapping):
        if "resourceSpans" in doc:
            for rs in doc["resourceSpans"] or []:
                for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
                    yield from ss.get("spans") or []
        elif "attributes" in doc or "events" in doc:
            yield doc


def read_otel_genai(text: str) -> Read:
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:  # a collector's file exporter: one OTLP document per line
        docs = []
        for line in text.splitlines():
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    out = Read()
    n = 0
    for span in _spans(docs):
        attrs = _attributes(span.get("attributes"))
        if not any(k.startswith("gen_ai.") for k in attrs) and not span.get("events"):
            continue  # not a GenAI span (an HTTP or a tool span of the same trace)
        n += 1
        turns = _from_input_messages(attrs) or _from_events(span) or _from_indexed(attrs)
        conv = _conversation(turns) if turns else None
        if conv is None:
            out.skipped.append(f"span {n}")
        else:
            out.conversations.append(conv)
    return out


def read_log(fmt: ImportFormat, text: str) -> Read:
    return read_openai_jsonl(text.splitlines()) if fmt == "openai-jsonl" else read_otel_genai(text)
