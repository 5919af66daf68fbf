"""``corl data import``: logged agent traffic (OpenAI request JSONL, OpenTelemetry GenAI spans) becomes a
prompt file of conversations, through the config's redaction, bounds and de-duplication; the chat task
reads that file as its source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from corl.cli import app
from corl.config import TaskConfig
from corl.data import load_splits
from corl.proto.conversation import Conversation

SECRET = "sk-live-0a1b2c3d4e5f"


def cohort_config(tmp_path: Path, **harvest: object) -> Path:
    cfg = {
        "members": [{"name": n, "model": "unused", "servers": [f"http://{n}"]} for n in ("a", "b")],
        "gateway": {"harvest": {"redact": {"patterns": [r"sk-live-\w+"]}, "max_chars": 200, **harvest}},
    }
    path = tmp_path / "cohort.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def chat_line(*turns: tuple[str, str]) -> str:
    return json.dumps({"model": "gpt", "messages": [{"role": r, "content": c} for r, c in turns]})


def test_openai_jsonl_import_redacts_bounds_and_dedupes(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_text(
        "\n".join(
            [
                chat_line(("system", "Be brief."), ("user", f"my key is {SECRET}")),
                chat_line(("system", "Be brief."), ("user", "What is 2+2?")),
                chat_line(("system", "Be brief."), ("user", "What is 2+2?")),  # a duplicate
                chat_line(("user", "x" * 500)),  # past max_chars
                "not json",
            ]
        )
    )
    out = tmp_path / "conversations.jsonl"
    res = _import(tmp_path, log, "openai-jsonl", out)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert SECRET not in text and SECRET not in res.output
    convs = [Conversation.model_validate_json(line) for line in text.splitlines()]
    assert [c.last_user for c in convs] == ["my key is [REDACTED]", "What is 2+2?"]
    assert all(c.system == "Be brief." for c in convs)
    for name, n in [("read", 4), ("skipped", 1), ("too large", 1), ("duplicate", 1), ("redacted", 1), ("written", 2)]:
        assert any(line.split() == [*name.split(), str(n)] for line in _rows(res.output)), (name, res.output)
    # The chat task reads the file as its source: conversations with their system text.
    splits = load_splits(TaskConfig(name="chat", source=str(out), eval_size=0), 0)
    assert sorted(Conversation.decode(e.prompt).last_user for e in splits.rl) == sorted(c.last_user for c in convs)


def _import(tmp_path: Path, log: Path, fmt: str, out: Path) -> Result:
    """``corl data import LOG --format FMT --out OUT`` with a cohort config of the test's own."""
    return CliRunner().invoke(
        app, ["data", "import", str(log), "--format", fmt, "--config", str(cohort_config(tmp_path)), "--out", str(out)]
    )


def _rows(output: str) -> list[str]:
    return [line.strip("│┃ ").replace("│", " ") for line in output.splitlines()]


def test_otel_genai_import(tmp_path: Path) -> None:
    span = {
        "name": "chat gpt",
        "attributes": [
            {"key": "gen_ai.input.messages", "value": {"stringValue": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": f"token {SECRET} please"}]}]
            )}},
        ],
    }  # fmt: skip
    log = tmp_path / "spans.json"
    log.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}))
    out = tmp_path / "c.jsonl"
    res = _import(tmp_path, log, "otel-genai", out)
    assert res.exit_code == 0, res.output
    [conv] = [Conversation.model_validate_json(line) for line in out.read_text().splitlines()]
    assert conv.last_user == "token [REDACTED] please"


@pytest.mark.parametrize("args", [["--format", "csv"], []])
def test_refuses_an_unknown_format(tmp_path: Path, args: list[str]) -> None:
    log = tmp_path / "x.jsonl"
    log.write_text("")
    res = CliRunner().invoke(app, ["data", "import", str(log), "--config", str(cohort_config(tmp_path)), *args])
    assert res.exit_code == 2
