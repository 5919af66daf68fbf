"""The CLI reference: every `corl` command and its `--help`, exactly as the command prints it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from markdown_text import cell, fenced

HELP_WIDTH = 100


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(words after `corl`, command) for every group and command, in the order `--help` lists them."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def help_text(app: Any, path: tuple[str, ...]) -> str:
    from typer.testing import CliRunner

    result = CliRunner().invoke(
        app, [*path, "--help"], prog_name="corl", env={"COLUMNS": str(HELP_WIDTH), "NO_COLOR": "1"}
    )
    if result.exit_code != 0:
        raise RuntimeError(f"corl {' '.join(path)} --help exited {result.exit_code}: {result.output}")
    return "\n".join(line.rstrip() for line in result.output.splitlines()).strip("\n")


def page() -> str:
    import typer

    from corl.cli import app

    root = typer.main.get_command(app)
    found = list(commands(root))
    lines = [
        "# CLI reference",
        "",
        "Generated at build time from the `corl` command itself: each section is that command's `--help`.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for path, command in found[1:]:
        title = " ".join(("corl", *path))
        summary = (command.short_help or command.help or "").strip().splitlines()[0]
        lines.append(f"| [`{title}`](#{'-'.join(('corl', *path))}) | {cell(summary)} |")
    lines.append("")
    for path, _command in found:
        title = " ".join(("corl", *path))
        lines += [f"## `{title}` {{ #{'-'.join(('corl', *path))} }}", "", fenced(help_text(app, path)), ""]
    return "\n".join(lines)
