"""The README stays a front door that works, and the generated reference has something to say for
every config field and CLI option."""

from __future__ import annotations

import re
import shlex
import sys
import typing
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel

from corl.cli import app
from corl.config import CohortConfig

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 200
# [text](target) and ![alt](target); a target ends at whitespace (an optional "title" may follow).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _models(annotation: typing.Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _reachable(root: type[BaseModel]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []
    todo = [root]
    while todo:
        model = todo.pop()
        if model not in seen:
            seen.append(model)
            todo += [m for field in model.model_fields.values() for m in _models(field.annotation)]
    return seen


def _commands(command: typing.Any, path: tuple[str, ...] = ("corl",)) -> typing.Iterator[tuple[str, typing.Any]]:
    yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _code_blocks(text: str) -> list[list[str]]:
    return [block.strip("\n").splitlines() for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)]


def _ci_test_command() -> str:
    """The command .ci/run runs as the README's test command (its one `python3 -m venv` line)."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    found = [line for line in lines if line.startswith("python3 -m venv .venv")]
    assert len(found) == 1, f".ci/run should run exactly one install-and-test command, found {found}"
    return found[0]


def test_every_cohort_config_field_has_a_description() -> None:
    models = _reachable(CohortConfig)
    assert len(models) > 10, "the walk should reach every section of the cohort config"
    missing = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not missing, f"config fields without a description (the reference page shows it): {missing}"


def test_every_cli_command_and_option_has_help() -> None:
    commands = list(_commands(typer.main.get_command(app)))
    assert any(path == "corl run" for path, _ in commands)
    no_help = [path for path, command in commands if not (command.help or command.short_help)]
    missing = [
        f"{path} {'/'.join(getattr(param, 'opts', [])) or param.name}"
        for path, command in commands
        for param in command.params
        if not (getattr(param, "help", None) or "").strip()
    ]
    assert not no_help, f"commands without help: {no_help}"
    assert not missing, f"CLI options and arguments without help text: {missing}"


def test_readme_starts_with_the_two_commands_ci_runs() -> None:
    text = README.read_text()
    first_block = _code_blocks(text)[0]
    assert text.index("```") < text.index("\n## "), "the two commands come before any section"
    assert len(first_block) == 2, first_block
    run_cmd, test_cmd = first_block
    assert test_cmd == _ci_test_command(), "the README's test command must be exactly what .ci/run runs"
    # The first command installs the same way, then runs the main job on the embedded default.
    install = test_cmd.split(" -e ")[0]
    assert run_cmd == f"{install} -e . && corl run"
    assert shlex.split(test_cmd)[:3] == ["python3", "-m", "venv"]


def test_readme_is_short() -> None:
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; it is the front door, the rest lives in docs/"


def test_every_relative_link_in_the_readme_resolves() -> None:
    targets = LINK.findall(README.read_text())
    assert targets, "the README links into the docs"
    broken = []
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL with a scheme, or an anchor of the README itself
        path = target.split("#", 1)[0]
        if not (ROOT / path).exists():
            broken.append(target)
    assert not broken, f"README links to files that do not exist: {broken}"


@pytest.fixture(scope="module")
def reference_modules() -> typing.Iterator[dict[str, typing.Any]]:
    """The generators of the site's reference pages (docs/_hooks), imported as the site build does."""
    hooks = str(ROOT / "docs" / "_hooks")
    sys.path.insert(0, hooks)
    try:
        import reference_cli
        import reference_config
        import reference_http
        import reference_metrics

        yield {"cli": reference_cli, "config": reference_config, "http": reference_http, "metrics": reference_metrics}
    finally:
        sys.path.remove(hooks)


def test_reference_pages_cover_the_code(reference_modules: dict[str, typing.Any]) -> None:
    cli = reference_modules["cli"].page()
    for path, _ in _commands(typer.main.get_command(app)):
        assert f"## `{path}`" in cli
    config = reference_modules["config"].page()
    for model in _reachable(CohortConfig):
        assert f"### {model.__name__} " in config
        for name in model.model_fields:
            assert f"| `{name}` |" in config
    http = reference_modules["http"].pages()
    assert set(http) == {
        "http-model-server.md",
        "http-aggregator.md",
        "http-evaluator.md",
        "http-sandbox.md",
        "http-gateway.md",
    }
    assert "### `POST /v1/generate`" in http["http-model-server.md"]
    assert "### `POST /v1/chat/completions`" in http["http-gateway.md"]
    assert "### `GET /v1/grading/tasks`" in http["http-aggregator.md"]
    metrics = reference_modules["metrics"].page()
    for name in ("corl_server_weight_version", "corl_aggregator_rounds_total", "corl_trainer_loss",
                 "corl_gateway_prompts_harvested_total"):  # fmt: skip
        assert f"| `{name}` |" in metrics
