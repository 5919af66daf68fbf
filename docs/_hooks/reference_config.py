"""The config reference: every field of the cohort config and of each service's environment settings,
read from the pydantic models themselves (type, default, constraints, description)."""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from markdown_text import cell
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# Constraint attributes of annotated_types metadata, as they read in a table.
_CONSTRAINTS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "min length", "max_length": "max length"}


def models_of(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation names, through unions, lists, dicts and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_of(arg)]


def reachable(root: type[BaseModel], path: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """(YAML path, model) for the root and every model reachable from its fields, each once, depth first."""
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel], at: str) -> Iterator[tuple[str, type[BaseModel]]]:
        if model in seen:
            return
        seen.add(model)
        yield at, model
        for name, field in model.model_fields.items():
            many = typing.get_origin(field.annotation) in (list, tuple) or "list[" in str(field.annotation)
            for sub in models_of(field.annotation):
                yield from walk(sub, f"{at}.{name}".lstrip(".") + ("[]" if many else ""))

    yield from walk(root, path)


def anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def type_text(annotation: Any, linked: set[type[BaseModel]]) -> str:
    """A field's type as a reader writes it: unions with |, literals quoted, models linked to their section."""
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{anchor(annotation)})" if annotation in linked else annotation.__name__
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a, linked) for a in args)
    if origin is typing.Annotated:
        return type_text(args[0], linked)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_text(a, linked) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return " | ".join(json.dumps(m.value) for m in annotation)
        return "secret" if issubclass(annotation, SecretStr) else annotation.__name__
    return str(annotation).replace("typing.", "")


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True) if field.default is PydanticUndefined else field.default
    if isinstance(value, BaseModel):
        return "(section defaults)"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        return f"`{json.dumps(value)}`"
    except TypeError:
        return f"`{value!r}`"


def constraint_text(field: FieldInfo) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sign in _CONSTRAINTS.items():
            if getattr(meta, attr, None) is not None:
                parts.append(f"{sign} {getattr(meta, attr)}")
        if getattr(meta, "pattern", None):
            parts.append(f"pattern `{meta.pattern}`")
    return ", ".join(parts)


def docstring(model: type[BaseModel]) -> str:
    doc = model.__dict__.get("__doc__")
    return " ".join(doc.split()) if doc else ""


def field_rows(model: type[BaseModel], linked: set[type[BaseModel]], key: Any = None) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        limits = constraint_text(field)
        description = (field.description or "").strip() + (f" ({limits})" if limits else "")
        rows.append(
            f"| `{key(name) if key else name}` | {cell(type_text(field.annotation, linked))} "
            f"| {cell(default_text(field))} | {cell(description) or '—'} |"
        )
    return rows


def cohort_section() -> list[str]:
    from corl.config import CohortConfig

    found = list(reachable(CohortConfig))
    linked = {model for _, model in found}
    lines = [
        "## The cohort config",
        "",
        "One YAML file describes a run, and every process reads it (`corl run --config`, "
        "`corl serve aggregator --config`, the trainers, compose's `deploy/cohort.compose.yaml`, the Helm "
        "chart's ConfigMap). Unknown keys are refused, every wrong field is reported at once, relative "
        "paths are resolved against the file's directory, and tokens never live in the file.",
        "",
    ]
    for path, model in found:
        where = f"`{path}`" if path else "top level"
        lines += [f"### {model.__name__} {{ #{anchor(model)} }}", "", f"Where: {where}.", ""]
        if doc := docstring(model):
            lines += [doc, ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|", *field_rows(model, linked), ""]
    return lines


def settings_classes() -> list[tuple[str, str, type[BaseModel]]]:
    """(process, command, settings class) of every service and the trainer."""
    from corl.services.aggregator.settings import AggregatorSettings
    from corl.services.evaluator.settings import EvaluatorSettings
    from corl.services.gateway.settings import GatewaySettings
    from corl.services.model.settings import ServerSettings
    from corl.services.sandbox.settings import SandboxSettings
    from corl.trainer.settings import TrainerSettings

    return [
        ("Model server", "corl serve model", ServerSettings),
        ("Aggregator", "corl serve aggregator", AggregatorSettings),
        ("Evaluator", "corl serve evaluator", EvaluatorSettings),
        ("Sandbox", "corl serve sandbox", SandboxSettings),
        ("Gateway", "corl serve gateway", GatewaySettings),
        ("Trainer", "corl train", TrainerSettings),
    ]


def env_names(prefix: str, name: str, field: FieldInfo) -> str:
    """The environment variables a settings field reads: its own name, or the names its alias lists."""
    alias = field.validation_alias
    choices = getattr(alias, "choices", None)
    if choices:
        names = [c for c in choices if isinstance(c, str) and c.isupper()]
        if names:
            return ", ".join(f"`{n}`" for n in names)
    return f"`{prefix}{name.upper()}`"


def settings_section() -> list[str]:
    lines = [
        "## Service settings (environment)",
        "",
        "Each service and the trainer read their own process settings from the environment (an env "
        "prefix per process; a nested setting joins its names with `__`, e.g. `CORL_BATCH__WINDOW_MS`). "
        "Run-wide facts (the task, the sampling settings, the reward mode, the members) are not among "
        "them: they live in the cohort config above.",
        "",
    ]
    for process, command, settings in settings_classes():
        prefix = settings.model_config.get("env_prefix", "")
        lines += [f"### {process} (`{command}`)", ""]
        if doc := docstring(settings):
            lines += [doc, ""]
        lines += ["| variable | type | default | description |", "|---|---|---|---|"]
        for name, field in settings.model_fields.items():
            subs = models_of(field.annotation)
            if subs:
                nested = f"{prefix}{name.upper()}__"
                lines += field_rows(subs[0], set(), key=lambda n, p=nested: f"{p}{n.upper()}")
                continue
            limits = constraint_text(field)
            description = (field.description or "").strip() + (f" ({limits})" if limits else "")
            lines.append(
                f"| {env_names(prefix, name, field)} | {cell(type_text(field.annotation, set()))} "
                f"| {cell(default_text(field))} | {cell(description) or '—'} |"
            )
        lines.append("")
    return lines


def page() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated at build time from the pydantic models (`corl.config` and each service's settings "
        "module): it cannot drift from the code. A test fails when a cohort config field has no description.",
        "",
        *cohort_section(),
        *settings_section(),
    ]
    return "\n".join(lines)
