"""``corl data``: what a cohort config's task source yields (counts, provenance, sample problems), and
``corl data import``: logged agent traffic as a prompt file, through the config's redaction."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=False)


@app.callback(invoke_without_command=True)
def show_data(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="Cohort config (YAML) whose task section to read.")] = None,
    show: Annotated[int, typer.Option(help="Print this many held-out problems.")] = 3,
) -> None:
    """Load the task's problems exactly as a run would and print the split sizes and a few problems."""
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        raise typer.BadParameter("name the cohort config whose task to show", param_hint="--config")
    import logging

    from rich.console import Console
    from rich.table import Table

    from corl.config import ConfigError, load_config
    from corl.data import load_splits

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = load_config(config)
    except ConfigError as err:
        raise typer.BadParameter(str(err), param_hint="--config") from None
    splits = load_splits(cfg.task, cfg.rounds.prompt_source.seed)
    console = Console()
    console.print(
        f"task [bold]{cfg.task.name}[/] from {cfg.task.source or 'its own generator'}: "
        f"{len(splits.rl)} RL prompts, {len(splits.eval)} held out"
    )
    table = Table("held-out problem", "answer (diagnostics only)")
    for ex in splits.eval[:show]:
        answer = ex.answer if ex.answer is not None else ("hidden tests" if ex.meta.get("test") else "-")
        table.add_row(ex.prompt.strip()[:200], answer)
    console.print(table)


@app.command("import")
def import_data(
    file: Annotated[Path, typer.Argument(help="The log to read (JSON lines, or an OTLP JSON export).")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="openai-jsonl: chat-completions requests (or {request, response} pairs, batch lines); "
            "otel-genai: OpenTelemetry GenAI spans exported as JSON.",
        ),
    ],
    config: Annotated[
        Path, typer.Option(help="Cohort config whose gateway.harvest redaction and bounds apply (YAML).")
    ],
    out: Annotated[Path, typer.Option(help='The prompt file to write: one {"messages": [...]} per line.')] = Path(
        "conversations.jsonl"
    ),
) -> None:
    """Turn logged chat requests into a prompt file of conversations (each ending with the user turn
    that was answered), redacted, bounded and de-duplicated exactly as the gateway harvests: train on it
    with task: {name: chat, source: <out>}."""
    import json

    from rich.console import Console
    from rich.table import Table

    from corl.config import ConfigError, load_config
    from corl.harvest import RedactionFailed, Redactor, digest, too_large
    from corl.harvest.formats import read_log

    if fmt not in ("openai-jsonl", "otel-genai"):
        raise typer.BadParameter(f"{fmt!r}: expected openai-jsonl or otel-genai", param_hint="--format")
    try:
        cfg = load_config(config)
        redactor = Redactor(cfg.gateway.harvest.redact)
    except (ConfigError, ValueError) as err:
        raise typer.BadParameter(str(err), param_hint="--config") from None
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise typer.BadParameter(f"cannot read {file}: {err}", param_hint="FILE") from None
    read = read_log(fmt, text)  # type: ignore[arg-type]
    policy = cfg.gateway.harvest
    seen: set[str] = set()
    counts = {"read": len(read.conversations), "skipped": len(read.skipped), "too large": 0, "redaction failed": 0}
    counts |= {"duplicate": 0, "redacted": 0, "written": 0}
    lines = []
    for conv in read.conversations:
        if too_large(policy, conv):
            counts["too large"] += 1
            continue
        try:
            conv, n = redactor(conv)
        except RedactionFailed:
            counts["redaction failed"] += 1
            continue
        key = digest(conv)
        if policy.dedupe and key in seen:
            counts["duplicate"] += 1
            continue
        seen.add(key)
        counts["redacted"] += n > 0
        lines.append(json.dumps({"messages": conv.turns()}, ensure_ascii=False))
    counts["written"] = len(lines)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(line + "\n" for line in lines))
    table = Table("conversations", "count", title=f"{file} ({fmt}) -> {out}")
    for name, n in counts.items():
        table.add_row(name, str(n))
    console = Console()
    console.print(table)
    if read.skipped:
        console.print(f"no conversation in: {', '.join(read.skipped[:20])}{' ...' if len(read.skipped) > 20 else ''}")
