"""``corl proto export [--check]``: write the contract's JSON Schemas and the OpenAPI documents of
the model server, the aggregator, the evaluator, the sandbox and the gateway into ``proto/``, generated
from the one pydantic definition (``corl.proto``) and the apps that serve it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(no_args_is_help=True)


def _proto_dir() -> Path:
    import corl.proto

    return Path(corl.proto.__file__).resolve().parent


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def exported_files() -> dict[str, str]:
    """Relative path under ``proto/`` -> file content, exactly as ``export`` writes it."""
    from pydantic import BaseModel

    import corl.proto
    from corl.services.aggregator.app import create_app as create_aggregator
    from corl.services.aggregator.settings import AggregatorSettings
    from corl.services.evaluator import EvaluatorSettings
    from corl.services.evaluator import create_app as create_evaluator
    from corl.services.gateway import GatewaySettings
    from corl.services.gateway import create_app as create_gateway
    from corl.services.model.app import create_app
    from corl.services.model.settings import ServerSettings
    from corl.services.sandbox import SandboxSettings
    from corl.services.sandbox import create_app as create_sandbox

    files: dict[str, str] = {}
    for name in corl.proto.__all__:
        obj = getattr(corl.proto, name)
        if isinstance(obj, type) and issubclass(obj, BaseModel):
            files[f"schemas/{name}.json"] = _dump(obj.model_json_schema())
    # Built with default settings and no model: the document depends on neither.
    server = create_app(ServerSettings(_env_file=None, model_dir=None))  # type: ignore[call-arg]
    files["openapi/model_server.json"] = _dump(server.openapi())
    # The cohort config is read in the lifespan, which building the document does not run.
    aggregator = create_aggregator(AggregatorSettings(_env_file=None, config=Path("cohort.yaml")))  # type: ignore[call-arg]
    files["openapi/aggregator.json"] = _dump(aggregator.openapi())
    evaluator = create_evaluator(EvaluatorSettings(_env_file=None, config=Path("cohort.yaml")))  # type: ignore[call-arg]
    files["openapi/evaluator.json"] = _dump(evaluator.openapi())
    files["openapi/sandbox.json"] = _dump(create_sandbox(SandboxSettings(_env_file=None)).openapi())  # type: ignore[call-arg]
    gateway = create_gateway(GatewaySettings(_env_file=None, config=Path("cohort.yaml")))  # type: ignore[call-arg]
    files["openapi/gateway.json"] = _dump(gateway.openapi())
    return files


def drift(root: Path | None = None) -> list[str]:
    """Exported files that are missing, stale, or no longer generated."""
    root = root or _proto_dir()
    want = exported_files()
    stale = [p for p, text in want.items() if not (root / p).is_file() or (root / p).read_text() != text]
    extra = [
        str(f.relative_to(root))
        for d in ("schemas", "openapi")
        if (root / d).is_dir()
        for f in (root / d).glob("*.json")
        if str(f.relative_to(root)) not in want
    ]
    return sorted(stale + extra)


@app.command("export")
def export(
    check: Annotated[bool, typer.Option("--check", help="Only compare; exit 1 if the files differ.")] = False,
    out: Annotated[Path | None, typer.Option(help="Target directory (default: the installed proto/).")] = None,
) -> None:
    """Write proto/schemas/<Model>.json and proto/openapi/{model_server,aggregator,evaluator,sandbox,gateway}.json."""
    root = out or _proto_dir()
    if check:
        differ = drift(root)
        for p in differ:
            typer.echo(f"differs: {p}", err=True)
        if differ:
            typer.echo("run `corl proto export` and commit the result", err=True)
            raise typer.Exit(1)
        typer.echo(f"proto exports up to date in {root}")
        return
    for rel, text in exported_files().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel in drift(root):  # files of models that no longer exist
        (root / rel).unlink()
    typer.echo(f"wrote {len(exported_files())} files under {root}")
